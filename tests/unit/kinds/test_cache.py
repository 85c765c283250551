"""libcni cache entries: cniCacheV1, legacy results, corrupt files, hostile ones."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reaper.host.files import MAX_LISTED_CORRUPT
from reaper.host.memo import FileMemo
from reaper.kinds import ReclaimContext
from reaper.kinds import cache as cache_kind
from reaper.kinds.cache import CacheCorrupt, collect_cache, costless, parse_cache_file, reclaim, ref, tie
from reaper.model import NsKey
from reaper.names import is_cni_id, is_ifname
from tests.harness.configs import cache_doc, conflist
from tests.harness.fuzz import FUZZ, hostile_names, json_values
from tests.harness.loopback import loopback_entry

CID = "a" * 64


def _cache_doc(**over: object) -> bytes:
    doc: dict[str, object] = {
        "kind": "cniCacheV1",
        "containerId": CID,
        "config": base64.b64encode(conflist()).decode(),
        "ifName": "eth0",
        "networkName": "my-net.v1",
        "result": {
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0"},
                {"name": "veth1234abcd"},
                {"name": "eth0", "sandbox": "/var/run/netns/cni-x"},
            ],
        },
    }
    doc.update(over)
    return json.dumps(doc).encode()


def test_cache_v1() -> None:
    doc, cid, net, ifname, legacy = parse_cache_file(f"my-net.v1-{CID}-eth0", _cache_doc(), set())
    assert (cid, net, ifname, legacy) == (CID, "my-net.v1", "eth0", False)
    assert doc["result"]["interfaces"][2]["sandbox"] == "/var/run/netns/cni-x"


def test_cache_legacy_bare_result_uses_known_network_names() -> None:
    bare = json.dumps({"cniVersion": "0.3.1", "interfaces": [{"name": "eth0", "sandbox": "/x"}], "ips": []}).encode()
    _, cid, net, ifname, legacy = parse_cache_file(f"my-net-2-{CID}-eth0", bare, {"my-net-2"})
    assert (cid, net, ifname, legacy) == (CID, "my-net-2", "eth0", True)
    # Without a known network, a 64-hex container ID still splits the name unambiguously.
    _, cid, net, _, _ = parse_cache_file(f"other-net-{CID}-eth0", bare, set())
    assert (cid, net) == (CID, "other-net")
    with pytest.raises(CacheCorrupt, match="cannot tell"):
        parse_cache_file("a-b-c-eth0", bare, set())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (_cache_doc()[:40], "truncated"),
        (b"[1]", "not a JSON object"),
        (_cache_doc(containerId="../../etc"), "containerId"),
        (_cache_doc(networkName="a/b"), "networkName"),
        (_cache_doc(ifName="x" * 20), "ifName"),
        (_cache_doc(kind="cniCacheV9"), "unknown cache kind"),
        (b'{"foo": 1}', "neither"),
    ],
)
def test_cache_corrupt(data: bytes, message: str) -> None:
    with pytest.raises(CacheCorrupt, match=message):
        parse_cache_file("whatever", data, set())


@FUZZ
@given(st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()), st.text(max_size=80))
def test_cache_parser_takes_any_bytes(data: bytes, name: str) -> None:
    try:
        _, cid, net, ifname, _ = parse_cache_file(name, data, {"net1", "my-net.v2"})
    except CacheCorrupt:
        return
    assert is_cni_id(cid) and is_cni_id(net) and is_ifname(ifname)


@FUZZ
@given(json_values, hostile_names, hostile_names, hostile_names)
def test_cache_entries_with_hostile_ids_are_corrupt(result: object, cid: str, net: str, ifname: str) -> None:
    doc = {"kind": "cniCacheV1", "containerId": cid, "networkName": net, "ifName": ifname, "result": result}
    try:
        _, got_cid, got_net, got_if, _ = parse_cache_file("x", json.dumps(doc).encode(), set())
    except CacheCorrupt:
        assert not (is_cni_id(cid) and is_cni_id(net) and is_ifname(ifname))
        return
    assert (got_cid, got_net, got_if) == (cid, net, ifname)


def test_hostile_cache_files_never_become_records(tmp_path: Path) -> None:
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    for i, cid in enumerate(["../../x", "a\nb", "a b", "a/b"]):
        doc = {"kind": "cniCacheV1", "containerId": cid, "networkName": "net1", "ifName": "eth0"}
        (results / f"entry{i}").write_text(json.dumps(doc))
    (results / "huge").write_bytes(b" " * (5 << 20))
    os.mkfifo(results / "fifo")
    inventory = collect_cache(str(tmp_path / "cache"), {"net1"})
    assert inventory.entries == ()
    errors = {Path(c.path).name: c.error for c in inventory.corrupt}
    assert set(errors) == {"entry0", "entry1", "entry2", "entry3", "huge", "fifo"}
    assert "limit" in errors["huge"] and "not a regular file" in errors["fifo"]


def test_a_network_name_with_dashes_and_dots_is_read_from_json_not_the_file_name(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    conflist = {"cniVersion": "1.0.0", "name": "my-net.v2-a", "plugins": [{"type": "bridge"}]}
    doc = cache_doc(CID, "my-net.v2-a", config=conflist)
    (results / f"my-net.v2-a-{CID}-eth0").write_text(json.dumps(doc))
    inventory = collect_cache(str(tmp_path), set())
    (entry,) = inventory.entries
    assert (entry.network, entry.container_id, entry.ifname) == ("my-net.v2-a", CID, "eth0")
    assert [c.name for c in inventory.configs] == ["my-net.v2-a"]


@pytest.mark.parametrize("netns", ["/proc/1/ns/net", "/proc/<own pid>/ns/net", "relative/path", "/nonexistent", ""])
def test_a_cache_entrys_netns_is_never_taken_at_its_word(tmp_path: Path, netns: str) -> None:
    netns = netns.replace("<own pid>", str(os.getpid()))
    results = tmp_path / "results"
    results.mkdir()
    doc = {"kind": "cniCacheV1", "containerId": CID, "networkName": "n", "ifName": "eth0", "netns": netns}
    (results / f"n-{CID}-eth0").write_text(json.dumps(doc))
    inventory = collect_cache(str(tmp_path), set())
    (entry,) = inventory.entries
    if netns == f"/proc/{os.getpid()}/ns/net":
        assert entry.netns is not None  # a real namespace: reconcile then sees who is inside
    elif netns == "/proc/1/ns/net":
        assert entry.netns is not None or entry.netns_uninspectable
    else:
        assert entry.netns is None and not entry.netns_uninspectable
    # A path no runtime writes is not looked at, and the report says so in one line.
    refused = netns.startswith(("relative", "/nonexistent"))
    assert (entry.netns_refused is not None) == refused
    assert [c.error.startswith(f"netns {netns!r} not looked at") for c in inventory.corrupt] == [True] * refused


def test_a_cache_entrys_netns_is_looked_up_in_the_netns_dirs_only(tmp_path: Path) -> None:
    """A pin in a netns dir it was given is looked at; the same pin named through
    /proc/<pid>/root, or a dir it was not given, is not."""
    netns_dir = tmp_path / "netns"
    netns_dir.mkdir()
    (netns_dir / "cni-1").touch()
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    for n, netns in enumerate((f"{netns_dir}/cni-1", f"/proc/{os.getpid()}/root{netns_dir}/cni-1")):
        cid = f"{n}" * 64
        doc = {"kind": "cniCacheV1", "containerId": cid, "networkName": "n", "ifName": "eth0", "netns": netns}
        (results / f"n-{cid}-eth0").write_text(json.dumps(doc))
    found = collect_cache(str(tmp_path / "cache"), set(), netns_dirs=[str(netns_dir)])
    by_cid = {e.container_id[0]: e for e in found.entries}
    pin = os.lstat(netns_dir / "cni-1")
    assert by_cid["0"].netns == NsKey(pin.st_dev, pin.st_ino) and by_cid["0"].netns_refused is None
    assert by_cid["1"].netns is None and by_cid["1"].netns_refused is not None
    assert ref(by_cid["1"]).details["netns_refused"] == by_cid["1"].netns_refused
    assert tie(by_cid["1"]).container_id == "1" * 64  # still tied by its container ID
    unpinned = collect_cache(str(tmp_path / "cache"), set())
    assert all(e.netns is None and e.netns_refused is not None for e in unpinned.entries)


def test_whose_entry_it_is_by_the_args_its_runtime_passed(tmp_path: Path) -> None:
    """CRI runtimes pass K8S_POD_NAMESPACE; podman passes K8S_POD_NAME alone (its CNI backend);
    a legacy result keeps no args at all."""
    results = tmp_path / "results"
    results.mkdir()
    cri = [["IgnoreUnknown", "1"], ["K8S_POD_NAMESPACE", "default"], ["K8S_POD_NAME", "web"]]
    podman = [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "web"]]
    for n, args in ((1, cri), (2, podman), (3, None)):
        cid = f"{n:064x}"
        doc = cache_doc(cid, "net1") if args is None else cache_doc(cid, "net1", cniArgs=args)
        (results / f"net1-{cid}-eth0").write_text(json.dumps(doc))
    (results / f"net1-{4:064x}-eth0").write_text(json.dumps({"cniVersion": "0.3.1", "interfaces": []}))
    owners = {e.container_id[-1]: e.owner for e in collect_cache(str(tmp_path), {"net1"}).entries}
    assert owners == {"1": "cri", "2": "other", "3": "unknown", "4": "unknown"}


def test_a_cache_file_nested_past_the_recursion_limit_is_one_corrupt_record(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / f"net1-{CID}-eth0").write_bytes(b"[" * 100_000)
    inventory = collect_cache(str(tmp_path), {"net1"})
    assert [c.error for c in inventory.corrupt] == ["truncated or invalid JSON: nested too deeply"]


def test_junk_files_past_the_cap_are_counted_not_held(tmp_path: Path) -> None:
    """100,000 junk files cost a count: at most MAX_LISTED_CORRUPT records, the rest one line."""
    results = tmp_path / "results"
    results.mkdir()
    extra = 25
    for n in range(MAX_LISTED_CORRUPT + extra):
        (results / f"junk-{n:05}").touch()
    memo: FileMemo[object] = FileMemo()
    inventory = collect_cache(str(tmp_path), set(), memo)
    assert len(inventory.corrupt) == MAX_LISTED_CORRUPT + 1
    summary = inventory.corrupt[-1]
    assert summary.path == str(results) and summary.count == extra and str(extra) in summary.error
    assert sum(c.count for c in inventory.corrupt) == MAX_LISTED_CORRUPT + extra
    assert len(memo) <= MAX_LISTED_CORRUPT


# ------------------------------------------------------------------------------ costless


def _loopback(netns: str = "/run/netns/cni-gone", **change: Any) -> bytes:
    """A loopback entry as containerd's libcni writes it, its parts changed as `change` says
    (config: a network list's bytes; result: the result; the rest: the document's keys)."""
    doc = json.loads(loopback_entry(CID, netns))
    for key, value in change.items():
        doc[key] = base64.b64encode(value).decode() if key == "config" else value
    return json.dumps(doc).encode()


def _costless(tmp_path: Path, data: bytes, name: str = f"cni-loopback-{CID}-lo") -> list[bool]:
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    (results / name).write_bytes(data)
    found = collect_cache(str(tmp_path), {"cni-loopback"}, netns_dirs=["/run/netns"])
    return [costless(e) for e in found.entries]


def test_a_loopbacks_entry_alone_with_its_namespace_gone_is_costless(tmp_path: Path) -> None:
    assert _costless(tmp_path, loopback_entry(CID, "/run/netns/cni-gone")) == [True]
    # The agent's memo keeps what the file said; the verdict is the same from it.
    memo: FileMemo[object] = FileMemo()
    first = collect_cache(str(tmp_path), set(), memo, netns_dirs=["/run/netns"])
    again = collect_cache(str(tmp_path), set(), memo, netns_dirs=["/run/netns"])
    assert [costless(e) for e in first.entries] == [costless(e) for e in again.entries] == [True]


_BRIDGE = json.dumps({"cniVersion": "0.3.1", "name": "cni-loopback", "plugins": [{"type": "bridge"}]}).encode()
_LO_IPAM = json.dumps(
    {"cniVersion": "0.3.1", "name": "cni-loopback", "plugins": [{"type": "loopback", "ipam": {"type": "host-local"}}]}
).encode()
_TWO_TYPES = json.dumps(
    {"cniVersion": "0.3.1", "name": "cni-loopback", "plugins": [{"type": "loopback", "Type": "bridge"}]}
).encode()
_NOT_LOOPBACK: dict[str, dict[str, Any]] = {
    "an address beyond loopback": {
        "result": {"cniVersion": "0.3.1", "interfaces": [{"name": "lo", "sandbox": "/x"}],
                   "ips": [{"address": "10.244.1.7/24", "interface": 0}]},
    },
    "an IPv4-mapped address": {
        "result": {"cniVersion": "0.3.1", "ips": [{"address": "::ffff:10.244.1.7/128"}]},
    },
    "an address that does not parse": {"result": {"cniVersion": "0.3.1", "ips": [{"address": "127.0.0.1.5/8"}]}},
    "an address not a string": {"result": {"cniVersion": "0.3.1", "ips": [{"address": 2130706433}]}},
    "a host interface": {
        "result": {"cniVersion": "0.3.1", "interfaces": [{"name": "lo", "sandbox": "/x"}, {"name": "veth1234abcd"}]},
    },
    "an interface other than lo": {
        "result": {"cniVersion": "0.3.1", "interfaces": [{"name": "eth0", "sandbox": "/x"}]},
    },
    "no result at all": {"result": None},
    "a second spelling of ips, which Go's decoder takes": {
        "result": {"cniVersion": "0.3.1", "ips": [{"address": "127.0.0.1/8"}], "IPs": [{"address": "10.0.0.5/24"}]},
    },
    "a second spelling of type, which Go's decoder takes": {"config": _TWO_TYPES},
    "the loopback's name on a bridge chain": {"config": _BRIDGE},
    "a loopback plugin naming an IPAM plugin": {"config": _LO_IPAM},
    "a config that does not decode": {"config": b"not json"},
}  # fmt: skip


@pytest.mark.parametrize("change", _NOT_LOOPBACK.values(), ids=list(_NOT_LOOPBACK))
def test_a_file_that_could_cost_a_pod_is_never_costless(tmp_path: Path, change: dict[str, Any]) -> None:
    """Named `cni-loopback-<id>-lo` and said to be a loopback's, but claiming more than a
    loopback has, or ADDed by more than the loopback plugin: it may be the only record of what
    a DEL needs, or name what a pod could be using."""
    assert _costless(tmp_path, _loopback(**change)) == [False]


def test_a_loopbacks_entry_whose_namespace_is_there_or_unreadable_is_not_costless(tmp_path: Path) -> None:
    netns_dir = tmp_path / "netns"
    netns_dir.mkdir()
    (netns_dir / "cni-here").touch()
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    (results / f"cni-loopback-{CID}-lo").write_bytes(loopback_entry(CID, f"{netns_dir}/cni-here"))
    (entry,) = collect_cache(str(tmp_path / "cache"), set(), netns_dirs=[str(netns_dir)]).entries
    assert entry.netns is not None and not costless(entry)
    # A netns path where no netns can be is not looked at: it is not costless either.
    (refused,) = collect_cache(str(tmp_path / "cache"), set()).entries
    assert refused.netns_refused is not None and not costless(refused)


def test_a_legacy_or_corrupt_loopback_file_is_not_costless(tmp_path: Path) -> None:
    bare = json.dumps(json.loads(loopback_entry(CID, "/x"))["result"]).encode()
    assert _costless(tmp_path, bare) == [False]
    (tmp_path / "results" / f"cni-loopback-{CID}-lo").write_bytes(b"")  # zero bytes: a crash's leftover
    assert _costless(tmp_path, b"") == [False]


def test_a_costless_entry_is_removed_only_while_it_is_still_a_loopbacks(tmp_path: Path) -> None:
    """Taken past --max-reap as costless, the file must still be a loopback's alone when it is
    removed: rewritten since the look (to a bridge chain, by the same names), it stays."""
    results = tmp_path / "results"
    results.mkdir()
    path = results / f"cni-loopback-{CID}-lo"
    path.write_bytes(loopback_entry(CID, "/run/netns/cni-gone"))
    (entry,) = collect_cache(str(tmp_path), set(), netns_dirs=["/run/netns"]).entries
    assert costless(entry)
    ctx = ReclaimContext(
        netns_dirs=(), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=1, done={}
    )
    path.write_bytes(_loopback(config=_BRIDGE))
    (done,) = reclaim([entry], ctx).values()
    assert not done.ok and "no longer a loopback's" in str(done.error) and path.exists()
    path.write_bytes(loopback_entry(CID, "/run/netns/cni-gone"))
    (done,) = reclaim([entry], ctx).values()
    assert done.ok and not path.exists()


@given(st.lists(st.sampled_from(["loopback", *_NOT_LOOPBACK]), min_size=1, max_size=12))
@settings(max_examples=40, deadline=None)
def test_what_the_agents_memo_keeps_reads_as_the_files_do(variants: list[str]) -> None:
    """The agent reads each unchanged file once and keeps what it said, shared strings
    interned: every entry, and whether it is costless, is what a fresh read of the files finds."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        results.mkdir()
        for n, variant in enumerate(variants):
            cid = f"{n:064x}"
            data = (
                loopback_entry(cid, "/run/netns/gone") if variant == "loopback" else _loopback(**_NOT_LOOPBACK[variant])
            )
            doc = json.loads(data)
            doc["containerId"] = cid
            (results / f"cni-loopback-{cid}-lo").write_text(json.dumps(doc))
        memo: FileMemo[object] = FileMemo(clock=lambda: 1 << 62)  # every file old enough to keep
        collect_cache(tmp, set(), memo, netns_dirs=["/run/netns"])
        memo.end_pass()
        kept = collect_cache(tmp, set(), memo, netns_dirs=["/run/netns"])
        assert len(memo) == len(variants), "the second read came from the memo"
        fresh = collect_cache(tmp, set(), netns_dirs=["/run/netns"])
        assert sorted(kept.entries, key=lambda e: e.path) == sorted(fresh.entries, key=lambda e: e.path)
        assert sorted(costless(e) for e in kept.entries) == sorted(v == "loopback" for v in variants)


@given(
    st.lists(st.tuples(st.sampled_from(["loopback", *_NOT_LOOPBACK]), st.integers(0, 50)), min_size=1, max_size=14),
    st.integers(1, 6),
)
@settings(max_examples=40, deadline=None)
def test_past_the_costless_hold_only_the_newest_costless_entries_are_left_out(
    files: list[tuple[str, int]], cap: int
) -> None:
    """A look holds at most COSTLESS_HELD costless entries, the oldest; every other entry is
    held whatever their number, and each entry held is what a look holding all finds."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        results = Path(tmp) / "results"
        results.mkdir()
        for n, (variant, age) in enumerate(files):
            cid = f"{n:064x}"
            data = (
                loopback_entry(cid, "/run/netns/gone") if variant == "loopback" else _loopback(**_NOT_LOOPBACK[variant])
            )
            doc = json.loads(data)
            doc["containerId"] = cid
            path = results / f"cni-loopback-{cid}-lo"
            path.write_text(json.dumps(doc))
            os.utime(path, (1e9 - age * 60 - n, 1e9 - age * 60 - n))
        whole = collect_cache(tmp, set(), netns_dirs=["/run/netns"])
        patch.setattr(cache_kind, "COSTLESS_HELD", cap)
        memo: FileMemo[object] = FileMemo(clock=lambda: 1 << 62)
        held = collect_cache(tmp, set(), memo, netns_dirs=["/run/netns"])
    by_path = {e.path: e for e in whole.entries}
    assert all(by_path[e.path] == e for e in held.entries), "each entry held reads as a whole look reads it"
    free = sorted((e for e in whole.entries if costless(e)), key=lambda e: (e.mtime, e.path))
    assert sorted(e.path for e in held.entries if costless(e)) == sorted(e.path for e in free[:cap])
    assert sorted(e.path for e in held.entries if not costless(e)) == sorted(
        e.path for e in whole.entries if not costless(e)
    )
    left_out = len(free) - min(cap, len(free))
    notes = [c for c in held.corrupt if "past the" in c.error]
    assert [c.count for c in notes] == ([left_out] if left_out else [])
    assert len(memo) == len(held.entries), "what is left out is not kept in the memo either"


def test_del_runs_from_the_file_at_libcnis_own_path_for_the_key(tmp_path: Path) -> None:
    """A file named otherwise that names the same key (a writer of the cache dir planted it,
    sorted first) never decides what DEL runs with while the file at the key's path is there:
    that is the only one a runtime's DEL reads."""
    results = tmp_path / "results"
    results.mkdir()
    planted = cache_doc(CID, "n", config=json.loads(conflist()))
    real = {**planted, "cniArgs": [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "real"]]}
    (results / "lock").write_text(json.dumps(planted))
    (results / f"n-{CID}-eth0").write_text(json.dumps(real))
    entries = sorted(collect_cache(str(tmp_path), {"n"}).entries, key=lambda e: e.name)
    assert [e.name for e in entries][-1] == f"n-{CID}-eth0" and len(entries) == 2, entries
    found = cache_kind.del_document(entries)
    assert found is not None and found[1] == str(results / f"n-{CID}-eth0") and found[0]["cniArgs"] == real["cniArgs"]
