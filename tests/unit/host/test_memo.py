"""The memo of parsed files, in memory and as a one-shot run saves it next to the state file.

It must never make a changed file look unchanged, and whoever can write the state dir must
gain nothing: a memo file that is corrupt, of another version or shape, or holds a value its
kind would not read from a file, is set aside whole and every file is read again.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import msgspec
import pytest

from reaper.host.memo import (
    MAX_MEMO_BYTES,
    MEMO_VERSION,
    RACY_NS,
    InventoryMemo,
    OutputMemo,
    Version,
    load_memo,
    memo_path,
    save_memo,
    stamp,
)
from reaper.kinds import cache, hostlocal, iptables
from reaper.kinds.cache import collect_cache
from reaper.kinds.hostlocal import collect_leases
from reaper.kinds.iptables import chain_name
from reaper.model import IptablesChain
from tests.harness.configs import cache_doc
from tests.harness.passes import settled_memo, write_private

CHECKS = {"cache": cache.said_in, "ipam": hostlocal.said_in}
REAL = "a" * 64
FORGED = "f" * 64
NET = "mynet"


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A cache dir with one entry and a data dir with one lease, both naming REAL."""
    entry = write_private(tmp_path / "cni" / "results", f"{NET}-{REAL}-eth0", json.dumps(cache_doc(REAL, NET)).encode())
    lease = write_private(tmp_path / "ipam" / NET, "10.88.0.5", f"{REAL}\r\neth0".encode())
    return tmp_path / "cni", entry, lease


def _look(tmp_path: Path, memo: InventoryMemo) -> tuple[set[str], set[str]]:
    """The container IDs the cache entries and the leases name, in one pass with `memo`."""
    memo.start_pass()
    entries = collect_cache(str(tmp_path / "cni"), set(), memo.of("cache")).entries
    leases, _ = collect_leases([str(tmp_path / "ipam")], memo.of("ipam"))
    memo.end_pass()
    return {e.container_id for e in entries}, {lease.container_id for lease in leases}


def _saved_then_loaded(tmp_path: Path) -> InventoryMemo:
    memo = settled_memo()
    _look(tmp_path, memo)
    path = memo_path(str(tmp_path / "state.json"))
    save_memo(path, memo, CHECKS)
    loaded, warning = load_memo(path, CHECKS, clock=lambda: time.time_ns() + 10 * RACY_NS)
    assert warning is None
    return loaded


def _forge(tmp_path: Path) -> str:
    """Rewrite the saved memo so that every value names FORGED (still a valid container ID)."""
    path = memo_path(str(tmp_path / "state.json"))
    doc = json.loads(Path(path).read_bytes())
    for rows in doc["kinds"].values():
        for row in rows:
            row[2][0] = FORGED
    Path(path).write_text(json.dumps(doc))
    return path


def test_a_one_shot_memo_is_saved_private_and_read_back(tmp_path: Path) -> None:
    _tree(tmp_path)
    loaded = _saved_then_loaded(tmp_path)
    assert stat.S_IMODE(os.stat(memo_path(str(tmp_path / "state.json"))).st_mode) == 0o600
    assert _look(tmp_path, loaded) == ({REAL}, {REAL})
    assert not loaded.changed  # nothing read anew, nothing forgotten: not written again


def test_a_remembered_value_stands_for_the_file_only_while_every_key_is_the_same(tmp_path: Path) -> None:
    _, entry, lease = _tree(tmp_path)
    _saved_then_loaded(tmp_path)
    path = _forge(tmp_path)
    later = lambda: time.time_ns() + 10 * RACY_NS  # noqa: E731
    # Unchanged files: the (forged) memo is what is read, which shows that it is used at all.
    assert _look(tmp_path, load_memo(path, CHECKS, later)[0]) == ({FORGED}, {FORGED})
    # The same size and mtime, new content: only ctime tells, and it is part of the key.
    for f in (entry, lease):
        st = f.stat()
        f.write_bytes(f.read_bytes())
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _look(tmp_path, load_memo(path, CHECKS, later)[0]) == ({REAL}, {REAL})


@pytest.mark.parametrize("change", ["inode", "size", "mtime"])
def test_any_key_that_differs_makes_the_file_read_again(tmp_path: Path, change: str) -> None:
    _, entry, lease = _tree(tmp_path)
    _saved_then_loaded(tmp_path)
    path = _forge(tmp_path)
    for f in (entry, lease):
        data, st = f.read_bytes(), f.stat()
        if change == "inode":
            f.unlink()
            f.write_bytes(data)
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        elif change == "size":
            f.write_bytes(data + b" ")
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        else:
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert _look(tmp_path, load_memo(path, CHECKS, lambda: time.time_ns() + 10 * RACY_NS)[0]) == ({REAL}, {REAL})


def test_the_device_is_part_of_the_key(tmp_path: Path) -> None:
    _, entry, _ = _tree(tmp_path)
    st = entry.stat()
    assert stamp(st) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    _saved_then_loaded(tmp_path)
    path = _forge(tmp_path)
    doc = json.loads(Path(path).read_bytes())
    for rows in doc["kinds"].values():
        for row in rows:
            row[1][0] += 1  # the same inode, size and times on another filesystem
    Path(path).write_text(json.dumps(doc))
    assert _look(tmp_path, load_memo(path, CHECKS, lambda: time.time_ns() + 10 * RACY_NS)[0]) == ({REAL}, {REAL})


def test_a_file_changed_just_before_the_pass_is_not_remembered(tmp_path: Path) -> None:
    """A rewrite of the same size within one tick of the kernel's coarse clock keeps every
    stamp: a file that recent is read again next pass."""
    _tree(tmp_path)
    memo = InventoryMemo()  # the real clock: the files were written a moment ago
    assert _look(tmp_path, memo) == ({REAL}, {REAL})
    assert len(memo.of("cache")) == len(memo.of("ipam")) == 0
    assert not memo.changed


def _valid_saved(tmp_path: Path) -> dict[str, object]:
    _tree(tmp_path)
    _saved_then_loaded(tmp_path)
    doc: dict[str, object] = json.loads(Path(memo_path(str(tmp_path / "state.json"))).read_bytes())
    return doc


def _with_value(doc: dict[str, object], kind: str, value: object) -> bytes:
    kinds = doc["kinds"]
    assert isinstance(kinds, dict)
    kinds[kind][0][2] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "hostile",
    [
        b"",
        b"\x00\xff garbage",
        b"[" * 100_000,
        b'{"version": 1}',
        json.dumps({"version": MEMO_VERSION + 1, "kinds": {}}).encode(),
        json.dumps({"version": MEMO_VERSION, "kinds": {"netns": []}}).encode(),  # a kind never saved
        json.dumps({"version": MEMO_VERSION, "kinds": {}, "more": 1}).encode(),
        json.dumps({"version": MEMO_VERSION, "kinds": {"cache": [["/x", [1, 2, 3], ["a"]]]}}).encode(),
        "cache: an ID no libcni would write",
        "cache: a netns path with a NUL",
        "cache: an ifname too long",
        "cache: a value of another shape",
        "ipam: an ID that is a path",
        "ipam: an ifname that is a number",
    ],
)
def test_a_hostile_or_corrupt_memo_is_set_aside_whole(tmp_path: Path, hostile: bytes | str) -> None:
    doc = _valid_saved(tmp_path)
    if isinstance(hostile, str):
        value = {
            "cache: an ID no libcni would write": [FORGED + "/..", NET, "eth0", None, [], "cri", [], None],
            "cache: a netns path with a NUL": [FORGED, NET, "eth0", "/run/netns/x\x00y", [], "cri", [], None],
            "cache: an ifname too long": [FORGED, NET, "e" * 16, None, [], "cri", [], None],
            "cache: a value of another shape": {"containerId": FORGED},
            "ipam: an ID that is a path": ["../../etc/passwd", "eth0"],
            "ipam: an ifname that is a number": [FORGED, 5],
        }[hostile]
        hostile = _with_value(doc, hostile.split(":")[0], value)
    path = memo_path(str(tmp_path / "state.json"))
    Path(path).write_bytes(hostile)
    memo, warning = load_memo(path, CHECKS)
    assert warning is not None and "every file is read again" in warning
    assert _look(tmp_path, memo) == ({REAL}, {REAL})


def test_a_memo_that_is_a_link_or_a_fifo_is_not_read(tmp_path: Path) -> None:
    _tree(tmp_path)
    path = memo_path(str(tmp_path / "state.json"))
    os.mkfifo(path)
    memo, warning = load_memo(path, CHECKS)  # never blocks on the FIFO
    assert warning is not None and not memo.changed
    os.unlink(path)
    target = tmp_path / "elsewhere"
    target.write_bytes(msgspec.json.encode({"version": MEMO_VERSION, "kinds": {}}))
    os.symlink(target, path)
    memo, warning = load_memo(path, CHECKS)
    assert warning is not None


def test_a_missing_memo_is_no_warning(tmp_path: Path) -> None:
    memo, warning = load_memo(memo_path(str(tmp_path / "state.json")), CHECKS)
    assert warning is None and not memo.changed


def test_a_command_output_is_parsed_again_unless_its_key_is_the_same() -> None:
    outputs = OutputMemo()
    parses: list[str] = []

    def parsed(name: str, text: str) -> tuple[str, ...]:
        def parse() -> tuple[str, ...]:
            parses.append(text)
            return tuple(text.split())

        return outputs.parsed(name, text, parse)

    assert parsed("save", "a b") == ("a", "b")
    outputs.end_pass()
    assert parsed("save", "a b") == ("a", "b")
    assert parses == ["a b"]  # the same key: last pass's result
    outputs.end_pass()
    assert parsed("save", "a c") == ("a", "c")
    assert parsed("other", "a c") == ("a", "c")  # by command, not by key alone
    assert parses == ["a b", "a c", "a c"]
    outputs.end_pass()
    outputs.end_pass()  # a pass that did not run the command forgets its output
    assert parsed("save", "a c") == ("a", "c")
    assert parses == ["a b", "a c", "a c", "a c"]


# (boot id, netns cookie, netns device, netns inode, nftables generation)
VERSION: Version = ("6f1d0c2e-0000-4000-8000-000000000001", 7, 4, 4026531840, 12)
NAT = "iptables:/usr/sbin/iptables-nft-save -t nat"
CHAIN_CHECKS = {**CHECKS, "iptables": iptables.saved_chains}


def _chain(network: str = NET, container_id: str = REAL) -> IptablesChain:
    name = chain_name("", network, container_id)
    rules = (
        f'-A {name} -d 10.88.0.0/16 -m comment --comment "name: \\"{network}\\" id: \\"{container_id}\\"" -j ACCEPT',
    )
    return IptablesChain(
        "ipv4",
        "nat",
        name,
        "masquerade",
        network,
        container_id,
        rules,
        (f"-A POSTROUTING -s 10.88.0.5/32 -j {name}",),
        "nft",
    )


def test_a_result_is_given_back_only_at_the_version_it_ran_at() -> None:
    outputs = OutputMemo()
    assert outputs.at_version("save", VERSION) is None  # nothing yet
    outputs.keep_at_version("save", VERSION, ("rules",), lasting=False)
    assert outputs.at_version("save", VERSION) is None  # not before the pass ends
    outputs.end_pass()
    assert outputs.at_version("save", VERSION) == ("rules",)
    others: Version = ("6f1d0c2e-0000-4000-8000-000000000002", 8, 5, 4026531841, 13)
    for at, other in enumerate(others):
        moved: Version = (*VERSION[:at], other, *VERSION[at + 1 :])  # another boot, netns, or generation
        assert outputs.at_version("save", moved) is None, moved
    assert outputs.at_version("other", VERSION) is None  # by command
    outputs.end_pass()  # a pass that neither ran it nor took its result forgets it
    assert outputs.at_version("save", VERSION) is None


def test_only_lasting_results_of_a_kind_that_checks_them_are_saved_and_read_back(tmp_path: Path) -> None:
    _tree(tmp_path)
    memo = settled_memo()
    chains = (_chain(),)
    memo.outputs.keep_at_version(NAT, VERSION, chains, lasting=True)
    memo.outputs.keep_at_version("iptables:/usr/sbin/ip6tables-nft-save -t nat", VERSION, (), lasting=False)
    memo.outputs.keep_at_version("firewall:/usr/sbin/iptables-nft-save -t filter", VERSION, ("SECRET",), lasting=True)
    _look(tmp_path, memo)
    assert memo.changed_in(CHAIN_CHECKS)
    path = memo_path(str(tmp_path / "state.json"))
    save_memo(path, memo, CHAIN_CHECKS)
    saved = Path(path).read_bytes()
    assert b"ip6tables" not in saved  # not lasting: this process's netns only
    assert b"SECRET" not in saved and b"firewall" not in saved  # no check of it: in memory only
    loaded, warning = load_memo(path, CHAIN_CHECKS, clock=lambda: time.time_ns() + 10 * RACY_NS)
    assert warning is None
    assert loaded.outputs.at_version(NAT, VERSION) == chains
    assert loaded.outputs.at_version(NAT, (*VERSION[:4], 13)) is None
    loaded.outputs.keep_at_version(NAT, VERSION, chains, lasting=True)  # used again, as it was
    _look(tmp_path, loaded)
    assert not loaded.changed_in(CHAIN_CHECKS)  # nothing new: the file is not written again
    _look(tmp_path, loaded)  # a pass that did not use it: forgotten, so the file is written again
    assert loaded.changed_in(CHAIN_CHECKS) and list(loaded.outputs.lasting()) == []


def _hostile_chain(what: str) -> object:
    good = msgspec.to_builtins(_chain())
    assert isinstance(good, dict)
    forged_name = chain_name("", NET, FORGED)
    changes: dict[str, dict[str, object]] = {
        "an owner its name is not the hash of": {"container_id": FORGED},
        "a name no plugin makes": {"chain": "CNI-not-a-hash", "network": None, "container_id": None},
        "a purpose its name does not have": {"purpose": "hostport-dnat"},
        "half an owner": {"container_id": None},
        "an owner that is a path": {"network": "../../etc", "chain": chain_name("", "../../etc", REAL)},
        "a rule of another chain": {"rules": [f"-A {forged_name} -j ACCEPT"]},
        "a jump that is no rule": {"jumps": ["-F POSTROUTING"]},
        "another table": {"table": "filter"},
        "another backend": {"backend": "evil"},
        "another family": {"family": "ipv5"},
        "a field more": {"extra": 1},
    }
    return [{**good, **changes[what]}]


@pytest.mark.parametrize(
    "hostile",
    [
        "an owner its name is not the hash of",
        "a name no plugin makes",
        "a purpose its name does not have",
        "half an owner",
        "an owner that is a path",
        "a rule of another chain",
        "a jump that is no rule",
        "another table",
        "another backend",
        "another family",
        "a field more",
        "a kind that saves no output",
        "a version that is no list",
        "chains that are no list",
    ],
)
def test_a_hostile_saved_output_sets_the_memo_aside_whole(tmp_path: Path, hostile: str) -> None:
    doc = _valid_saved(tmp_path)
    row: list[object] = [NAT, list(VERSION), [msgspec.to_builtins(_chain())]]
    if hostile == "a kind that saves no output":
        row[0] = "netns:/usr/sbin/iptables-nft-save -t nat"
    elif hostile == "a version that is no list":
        row[1] = "6f1d0c2e"
    elif hostile == "chains that are no list":
        row[2] = {"chain": "CNI-x"}
    else:
        row[2] = _hostile_chain(hostile)
    path = memo_path(str(tmp_path / "state.json"))
    Path(path).write_bytes(msgspec.json.encode({**doc, "outputs": [row]}))
    memo, warning = load_memo(path, CHAIN_CHECKS)
    assert warning is not None and "every file is read again" in warning
    assert memo.outputs.at_version(NAT, VERSION) is None
    assert _look(tmp_path, memo) == ({REAL}, {REAL})
    # The same memo with the true chain is read: the case above is refused for its own reason.
    Path(path).write_bytes(
        msgspec.json.encode({**doc, "outputs": [[NAT, list(VERSION), [msgspec.to_builtins(_chain())]]]})
    )
    memo, warning = load_memo(path, CHAIN_CHECKS)
    assert warning is None and memo.outputs.at_version(NAT, VERSION) == (_chain(),)


def test_a_memo_bigger_than_the_cap_is_set_aside_unread(tmp_path: Path) -> None:
    _tree(tmp_path)
    path = memo_path(str(tmp_path / "state.json"))
    with open(path, "wb") as f:
        f.truncate(MAX_MEMO_BYTES + 1)  # sparse: 64 MiB of NULs on no disk
    memo, warning = load_memo(path, CHAIN_CHECKS)
    assert warning is not None and "every file is read again" in warning
    assert _look(tmp_path, memo) == ({REAL}, {REAL})
