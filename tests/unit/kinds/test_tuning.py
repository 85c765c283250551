"""The tuning plugin's backup files: the bytes tuning writes, where it writes them, hostile
names and contents, the compare before each one is removed, and the file in an attachment."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from reaper.host.memo import InventoryMemo
from reaper.host.quarantine import Quarantine
from reaper.kinds import Look, ReclaimContext, cache, tuning
from reaper.kinds.hostlocal import collect_leases
from reaper.kinds.registry import REGISTRY, Registry
from reaper.kinds.tuning import TuningBackup, TuningFile, parse_backup, split_name
from reaper.model import ContainerTie, NetworkConfig, NodeSnapshot, ScanReport
from reaper.names import is_cni_id, is_ifname
from reaper.options import FindOptions
from reaper.reap.plan import plan_attachment
from reaper.snapshot import take_snapshot
from tests.harness.configs import cache_doc
from tests.harness.fifo import watched_fifo
from tests.harness.fuzz import FUZZ, json_values
from tests.harness.passes import (
    bare_reclaimer,
    confirmed,
    look_at,
    node_config,
    options_at,
    settled_memo,
    verdicts_and_kinds,
    with_records,
    write_private,
)
from tests.harness.snapshots import NET, NOW, OLD, POLICY, cid, lease, pin, sandbox, snapshot

CID = "f" * 64  # a sandbox ID as containerd and CRI-O make them
OTHER = "e" * 64

# containernetworking/plugins v1.9.1, plugins/meta/tuning/tuning.go createBackup:
# json.MarshalIndent(configToRestore, "", " "), fields in struct order, omitempty, no newline.
# A config with "mac" and "mtu" (the commonest: a MAC per pod, an MTU per network):
BACKUP = b'{\n "mac": "0a:58:0a:f4:01:05",\n "mtu": 1450\n}'
# Every field (promisc, allmulti and txQLen are pointers: false and 0 are written):
BACKUP_ALL = b'{\n "mac": "0a:58:0a:f4:01:05",\n "promisc": false,\n "mtu": 1500,\n "allmulti": true,\n "txQLen": 0\n}'
# "mac" set on an interface with no hardware address: HardwareAddr.String() is "", omitted.
BACKUP_EMPTY = b"{}"


def _options(root: Path) -> FindOptions:
    return options_at(root / "cni")


def _look(root: Path, *configs: NetworkConfig, memo: InventoryMemo | None = None) -> Look:
    return look_at(root / "cni", *configs, memo=memo)


def _name(container_id: str = CID, ifname: str = "eth0") -> str:
    return f"{container_id}_{ifname}.json"  # tuning.go: containerID+"_"+ifName+".json"


def _collected(*dirs: Path) -> tuple[dict[str, TuningFile], dict[str, str]]:
    found = tuning.collect([str(d) for d in dirs])
    return {os.path.basename(f.path): f for f in found.records}, {c.path: c.error for c in found.corrupt}


@pytest.fixture
def default_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The module's default dir (/run/cni/tuning on a node), here."""
    directory = tmp_path / "run" / "cni" / "tuning"
    monkeypatch.setattr(tuning, "DEFAULT_DIR", str(directory))
    return directory


# ---------------------------------------------------------------------------------- the format


def test_the_files_tuning_writes() -> None:
    assert parse_backup(BACKUP) == TuningBackup(mac="0a:58:0a:f4:01:05", mtu=1450)
    assert parse_backup(BACKUP_ALL) == TuningBackup(
        mac="0a:58:0a:f4:01:05", promisc=False, mtu=1500, allmulti=True, txqlen=0
    )
    assert parse_backup(BACKUP_EMPTY) == TuningBackup()
    assert parse_backup(BACKUP_ALL).restores() == "mac=0a:58:0a:f4:01:05,promisc=false,mtu=1500,allmulti=true,txQLen=0"
    # v1.0.0 to v1.3.x write no txQLen: the same struct without it.
    assert parse_backup(b'{\n "promisc": true\n}') == TuningBackup(promisc=True)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'{"mac": "0A:58:0A:F4:01:05"}', "invalid mac"),  # Go writes lowercase
        (b'{"mac": "0a:58\\u0000"}', "invalid mac"),
        (b'{"mac": ""}', "invalid mac"),  # omitempty: never written
        (b'{"mtu": 0}', "invalid mtu"),  # omitempty: never written
        (b'{"mtu": 1500.0}', "invalid mtu"),
        (b'{"mtu": true}', "invalid mtu"),
        (b'{"txQLen": -1}', "invalid txQLen"),
        (b'{"txQLen": 4294967296}', "invalid txQLen"),
        (b'{"promisc": 1}', "invalid promisc"),
        (b'{"allmulti": null}', "invalid allmulti"),
        (b'{"mac": "0a:58:0a:f4:01:05", "sysctl": {}}', "unknown key"),
        (b'["a list"]', "not a JSON object"),
        (b'{"mac": "\xff"}', "UTF-8"),
        (b'{"mac": "0a:58\x00"}', "control character"),  # a raw NUL
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_contents_tuning_never_writes_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_backup(data)


@FUZZ
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_the_parser_takes_any_bytes(data: bytes) -> None:
    try:
        backup = parse_backup(data)
    except ValueError:
        return
    assert backup.mac is None or re.fullmatch(r"[0-9a-f:]+", backup.mac)


def test_the_name_is_split_on_its_last_underscore() -> None:
    assert split_name(_name()) == (CID, "eth0")
    assert split_name(_name("abc.1-2", "net1")) == ("abc.1-2", "net1")
    for bad in (
        f"{CID}.json",  # no `_`
        f"{CID}_eth0",  # no .json
        f"{CID}_eth0.json.tmp",
        f"{CID}_.json",  # no ifname
        "_eth0.json",  # no container ID
        f"-{CID}_eth0.json",  # not a CNI ID
        f"{CID}_a:b.json",  # not an ifname
        f"{CID}_{'x' * 16}.json",  # longer than IFNAMSIZ allows
        f"{CID}_net_1.json",  # ambiguous: `<CID>` with net_1, or `<CID>_net` with 1
        ".json",
    ):
        with pytest.raises(ValueError):
            split_name(bad)


@FUZZ
@given(st.text(max_size=80))
def test_a_name_split_is_a_container_id_and_an_ifname(name: str) -> None:
    try:
        container_id, ifname = split_name(name)
    except ValueError:
        return
    assert is_cni_id(container_id) and is_ifname(ifname) and "_" not in container_id
    assert name == f"{container_id}_{ifname}.json"


# ------------------------------------------------------------------------------------- finding


def test_found_in_the_default_dir_and_in_each_tuning_data_dir_of_the_conf_dir(
    tmp_path: Path, default_dir: Path
) -> None:
    default = write_private(default_dir, _name(), BACKUP)
    custom_dir = tmp_path / "custom"
    custom = write_private(custom_dir, _name(OTHER, "net1"), BACKUP_ALL)
    write_private(tmp_path / "bridge-data", _name("a" * 64), BACKUP)
    configs = (
        node_config({"type": "bridge"}, {"type": "tuning", "mac": "0a:58:0a:f4:01:05", "dataDir": f"/{custom_dir}/"}),
        node_config({"type": "bridge", "dataDir": str(tmp_path / "bridge-data")}, name="other"),  # not tuning's
        node_config({"type": "tuning", "dataDir": str(default_dir)}, name="again"),  # the default, read once
    )
    found = tuning.find(_look(tmp_path, *configs))
    assert found.corrupt == ()
    files = {f.container_id: f for f in found.records}
    assert set(files) == {CID, OTHER}
    one, two = files[CID], files[OTHER]
    assert (one.path, one.root, one.content) == (str(default), str(default_dir), parse_backup(BACKUP))
    assert (two.path, two.root, two.content) == (str(custom), str(custom_dir), parse_backup(BACKUP_ALL))
    assert one.mtime == default.stat().st_mtime and one.corrupt is None
    ref = tuning.KIND.ref(one)
    assert (
        ref.kind == "tuning" and ref.name == CID and ref.identity == tuning.KIND.identity(one) == ("tuning", one.path)
    )
    assert ref.details == {"path": one.path, "ifname": "eth0", "restores": "mac=0a:58:0a:f4:01:05,mtu=1450"}
    assert tuning.KIND.ref(two).details["ifname"] == "net1"
    assert tuning.KIND.tie(one) == ContainerTie(CID) and tuning.KIND.tie(two) == ContainerTie(OTHER)


def test_the_default_dir_is_tunings() -> None:
    assert tuning.DEFAULT_DIR == "/run/cni/tuning"  # tuning.go defaultDataDir
    assert tuning.KIND.name == "tuning" and not tuning.KIND.last and tuning.KIND.quarantinable
    assert tuning.KIND in REGISTRY.kinds and "tuning" in REGISTRY.quarantinable


def test_a_missing_dir_is_empty(tmp_path: Path, default_dir: Path) -> None:
    found = tuning.find(_look(tmp_path))
    assert found.records == () and found.corrupt == ()


def test_a_data_dir_only_a_cached_config_names_is_never_read(tmp_path: Path, default_dir: Path) -> None:
    """Whoever can write the cache dir writes what its entries' configs say."""
    planted = tmp_path / "planted"
    write_private(planted, _name(), BACKUP)
    write_private(default_dir, _name(OTHER), BACKUP)
    conflist = {"cniVersion": "1.0.0", "name": "mynet", "plugins": [{"type": "tuning", "dataDir": str(planted)}]}
    write_private(
        tmp_path / "cni" / "results", f"mynet-{CID}-eth0", json.dumps(cache_doc(CID, "mynet", config=conflist)).encode()
    )
    taken = take_snapshot(_options(tmp_path), registry=Registry(kinds=(cache.KIND, tuning.KIND)))
    assert [c.name for c in taken.configs] == ["mynet"], "the cached config was read"
    assert [f.container_id for f in taken.of("tuning")] == [OTHER]


def test_a_data_dir_that_is_or_holds_a_dir_the_reaper_reads_is_not_read(tmp_path: Path, default_dir: Path) -> None:
    cni = tmp_path / "cni"
    write_private(cni, _name(), b"{}")
    configs = [node_config({"type": "tuning", "dataDir": d}) for d in ("/", str(cni), f"{tmp_path}/")]
    found = tuning.find(_look(tmp_path, *configs))
    assert found.records == ()
    assert {c.path for c in found.corrupt} == {"/", str(cni), str(tmp_path)}
    assert all("not read" in c.error for c in found.corrupt)


@pytest.mark.parametrize("data_dir", ["relative/dir", "/a\u0000b", "/a\ud800b", "", "/" + "x" * 5000])
def test_a_data_dir_no_path_can_be_is_passed_over(tmp_path: Path, default_dir: Path, data_dir: str) -> None:
    write_private(default_dir, _name(), BACKUP)
    found = tuning.find(_look(tmp_path, node_config({"type": "tuning", "dataDir": data_dir})))
    assert [f.container_id for f in found.records] == [CID] and found.corrupt == ()


def test_files_tuning_could_not_have_written_are_still_their_containers(tmp_path: Path) -> None:
    """os.WriteFile truncates, then writes: a crash between leaves an empty file, which DEL
    cannot parse and so keeps; the file is its container's, with why it is not a backup."""
    bad = {
        "1" * 64: b"",
        "2" * 64: BACKUP[:20],
        "3" * 64: b'{"mac": "\xff\xfe"}',
        "4" * 64: b'{"mtu": 1450}\x00',
        "5" * 64: b"[" * 30_000,
        "6" * 64: b'{"mac": "not a mac"}',
    }
    for container_id, data in bad.items():
        write_private(tmp_path, _name(container_id), data)
    files, corrupt = _collected(tmp_path)
    assert corrupt == {} and {f.container_id for f in files.values()} == set(bad)
    reasons = {f.container_id[0]: f.corrupt for f in files.values()}
    assert all(f.content is None and tuning.KIND.tie(f) == ContainerTie(f.container_id) for f in files.values())
    assert reasons["1"] == "empty file" and "UTF-8" in str(reasons["3"]) and reasons["5"] == "nested too deeply"
    assert reasons["2"] is not None and reasons["4"] is not None and "invalid mac" in str(reasons["6"])
    assert tuning.KIND.ref(files[_name("1" * 64)]).details["corrupt"] == "empty file"


def test_entries_that_are_no_containers_backup_are_corrupt_never_records(tmp_path: Path) -> None:
    data_dir = tmp_path / "tuning"
    names = {
        "a": f"{CID}.json",  # no `_`
        "b": f"-{CID}_eth0.json",  # no CNI ID
        "c": f"{CID}_net_1.json",  # ambiguous
        "d": f"{CID}_eth0",  # no .json
        "e": f"{CID}_a b.json",  # no ifname
    }
    for name in names.values():
        write_private(data_dir, name, BACKUP)
    fd = os.open(os.fsencode(data_dir) + b"/\xff\xfe_eth0.json", os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    victim = write_private(tmp_path / "victim", "secret", BACKUP)
    (data_dir / _name("1" * 64)).symlink_to(victim)
    write_private(data_dir, _name("3" * 64), b" " * (tuning.MAX_TUNING_BYTES + 1))
    (data_dir / _name("4" * 64)).mkdir()  # nothing tuning makes: passed over
    with watched_fifo(data_dir / _name("2" * 64)) as fifo:
        files, corrupt = _collected(data_dir)
        assert not fifo.opened(), "the FIFO was opened: a read of it would wait for a writer"
    assert files == {}
    errors = {os.path.basename(path): error for path, error in corrupt.items()}
    assert len(errors) == 9
    assert errors[names["a"]] == errors[names["d"]] == "file name is not <container ID>_<ifname>.json"
    assert errors[names["b"]] == "file name's container ID is not a container ID"
    assert "ambiguous" in errors[names["c"]] and "not an interface name" in errors[names["e"]]
    assert errors["\udcff\udcfe_eth0.json"] == "file name's container ID is not a container ID"
    assert errors[_name("1" * 64)] == "symlink, not followed" and errors[_name("2" * 64)] == "not a regular file"
    assert "limit" in errors[_name("3" * 64)]
    assert victim.read_bytes() == BACKUP


def test_a_symlinked_data_dir_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    write_private(victim, _name(), BACKUP)
    linked = tmp_path / "linked"
    linked.symlink_to(victim)
    files, corrupt = _collected(linked)
    assert files == {} and "is a symlink" in corrupt[str(linked)]


def test_an_unchanged_file_is_not_read_again(tmp_path: Path, default_dir: Path) -> None:
    write_private(default_dir, _name(), BACKUP)
    memo = settled_memo()
    (first,) = tuning.find(_look(tmp_path, memo=memo)).records
    memo.end_pass()
    (again,) = tuning.find(_look(tmp_path, memo=memo)).records
    assert again is first


# ----------------------------------------------------------------------------------- reclaiming


def _ctx(quarantine: Quarantine | None = None) -> ReclaimContext:
    return ReclaimContext(
        netns_dirs=(), bin_dirs=(), live_netns=frozenset(), quarantine=quarantine, command_timeout=1.0, done={}
    )


def test_reclaim_removes_the_file_that_was_judged(tmp_path: Path) -> None:
    kept = write_private(tmp_path, _name(), BACKUP)
    empty = write_private(tmp_path, _name(OTHER), b"")
    judged, _ = _collected(tmp_path)
    done = tuning.KIND.reclaim(list(judged.values()), _ctx())
    assert all(d.ok for d in done.values()) and set(done) == {("tuning", str(kept)), ("tuning", str(empty))}
    assert list(tmp_path.iterdir()) == []
    again = tuning.KIND.reclaim(list(judged.values()), _ctx())
    assert all(d.ok for d in again.values()), "already gone: freed"


def test_reclaim_leaves_a_file_replaced_or_rewritten_since_it_was_judged(tmp_path: Path) -> None:
    names = [_name("1" * 64), _name("2" * 64), _name("3" * 64)]
    for name in names:
        write_private(tmp_path, name, BACKUP)
    other = write_private(tmp_path / "elsewhere", _name(OTHER), BACKUP_ALL)
    judged, _ = _collected(tmp_path)
    replaced, rewritten, renamed_over = (tmp_path / n for n in names)
    # A new pod's ADD with the same container ID and ifname: removed and made again with the
    # same bytes and times, another inode.
    stat = replaced.stat()
    replaced.unlink()
    replaced.write_bytes(BACKUP)
    os.utime(replaced, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rewritten.write_bytes(BACKUP_ALL)  # written in place
    os.rename(other, renamed_over)  # another file renamed over it
    done = tuning.KIND.reclaim([judged[n] for n in names], _ctx())
    for name in names:
        result = done[("tuning", str(tmp_path / name))]
        assert not result.ok and "since it was judged" in str(result.error)
        assert (tmp_path / name).exists()


def test_reclaim_never_follows_a_data_dir_made_a_symlink_since(tmp_path: Path) -> None:
    data_dir = tmp_path / "tuning"
    write_private(data_dir, _name(), BACKUP)
    judged, _ = _collected(data_dir)
    victim = tmp_path / "victim"
    data_dir.rename(victim)
    data_dir.symlink_to(victim)
    (result,) = tuning.KIND.reclaim(list(judged.values()), _ctx()).values()
    assert not result.ok and "cannot re-read" in str(result.error)
    assert (victim / _name()).exists()


def test_reclaim_with_a_quarantine_moves_the_file(tmp_path: Path) -> None:
    path = write_private(tmp_path / "tuning", _name(), BACKUP)
    judged, _ = _collected(tmp_path / "tuning")
    quarantine = Quarantine(str(tmp_path / "quarantine"))
    (result,) = tuning.KIND.reclaim(list(judged.values()), _ctx(quarantine)).values()
    assert result.ok and result.quarantined == quarantine.destination(str(path))
    assert not path.exists() and Path(result.quarantined).read_bytes() == BACKUP


# --------------------------------------------------------------------------------- attachments


def _twice(snap: NodeSnapshot, *sandboxes: Any) -> ScanReport:
    return confirmed(snap, POLICY, NOW, *sandboxes)


def _node(tmp_path: Path) -> tuple[NodeSnapshot, Path, Path]:
    """One dead container's lease and tuning backup on disk: the runtime's DEL came after its
    netns was gone, so host-local freed nothing yet and tuning kept its file."""
    net_dir = tmp_path / "ipam" / NET
    net_dir.mkdir(parents=True)
    lease_file = net_dir / "10.0.0.2"
    lease_file.write_bytes(f"{cid(1)}\r\neth0".encode())
    backup = write_private(tmp_path / "tuning", _name(cid(1)), BACKUP)
    leases, _ = collect_leases([str(tmp_path / "ipam")])
    found = tuning.collect([str(tmp_path / "tuning")])
    snap = with_records(
        snapshot(leases=tuple(replace(x, mtime=OLD) for x in leases)),
        tuning=tuple(replace(f, mtime=OLD) for f in found.records),
    )
    return snap, lease_file, backup


def _present(snap: NodeSnapshot) -> dict[tuple[str, ...], Any]:
    return {kind.identity(r): r for kind in REGISTRY.kinds for r in snap.of(kind.name)}


def test_a_dead_containers_backup_joins_its_lease_and_is_reclaimed(tmp_path: Path) -> None:
    snap, lease_file, backup = _node(tmp_path)
    (attachment,) = _twice(snap).attachments
    assert (attachment.key.container_id, attachment.key.network, attachment.key.ifname) == (cid(1), NET, "eth0")
    assert attachment.verdict == "orphan" and sorted(r.kind for r in attachment.resources) == ["ipam", "tuning"]
    steps = plan_attachment(attachment, None, None, quarantine=True).steps
    assert {(s.kind, s.method) for s in steps} == {("tuning", "quarantine"), ("ipam", "quarantine")}
    done = bare_reclaimer()._kernel([attachment], _present(snap), {}, set(), _present(snap))
    assert len(done) == 2 and all(d.ok for d in done.values())
    assert not lease_file.exists() and not backup.exists()


def test_a_live_containers_backup_is_live() -> None:
    def _file(n: int, ifname: str) -> TuningFile:
        path = f"/run/cni/tuning/{_name(cid(n), ifname)}"
        return TuningFile(
            container_id=cid(n),
            path=path,
            root="/run/cni/tuning",
            mtime=OLD,
            stamp=(1, n, 1, 1, 1),
            content=parse_backup(BACKUP),
        )

    snap = with_records(
        snapshot(pins=(pin(1, OLD),), leases=(lease(1, OLD),)),
        tuning=(_file(1, "eth0"), _file(1, "net1"), _file(2, "eth0")),
    )
    report = _twice(snap, sandbox(1), sandbox(2, with_netns=False))
    assert verdicts_and_kinds(report) == {
        cid(1): ("live", ["ipam", "netns", "tuning", "tuning"]),
        cid(2): ("live", ["tuning"]),
    }


def test_a_lone_backup_of_a_dead_container_is_an_attachment_of_its_own(tmp_path: Path) -> None:
    """The commonest leak: everything else of the pod is gone, the backup alone stays."""
    _, _, backup = _node(tmp_path)
    found = tuning.collect([str(backup.parent)])
    (attachment,) = _twice(
        with_records(snapshot(), tuning=tuple(replace(f, mtime=OLD) for f in found.records))
    ).attachments
    assert (attachment.key.container_id, attachment.key.network, attachment.key.ifname) == (cid(1), None, None)
    assert attachment.verdict == "orphan"
    young = _twice(with_records(snapshot(), tuning=found.records))
    assert young.attachments[0].verdict == "pending"
