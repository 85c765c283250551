"""flannel's per-container files: the bytes flannel writes, where it writes them, hostile ones,
and the compare before each one is removed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.host.quarantine import Quarantine
from reaper.kinds import ReclaimContext, cache, flannel
from reaper.kinds.flannel import FlannelDelegate, FlannelFile, parse_delegate
from reaper.kinds.registry import Registry
from reaper.model import ContainerTie, NetworkConfig
from reaper.names import PLUGIN_TYPE, is_cni_id
from reaper.snapshot import take_snapshot
from tests.harness.configs import cache_doc
from tests.harness.fifo import watched_fifo
from tests.harness.fuzz import FUZZ, json_values
from tests.harness.passes import look_at, node_config, options_at, settled_memo, write_private
from tests.harness.plugin_files import FLANNEL_CONF, flannel_scratch

CID = "f" * 64  # a sandbox ID as containerd and CRI-O make them
OTHER = "e" * 64


def _conf(*plugins: dict[str, object], name: str = "cbr0") -> NetworkConfig:
    return node_config(*plugins, name=name)


def _found(cache_dir: Path, *configs: NetworkConfig) -> tuple[dict[str, FlannelFile], dict[str, str]]:
    found = flannel.find(look_at(cache_dir, *configs))
    return {f.container_id: f for f in found.records}, {c.path: c.error for c in found.corrupt}


# ---------------------------------------------------------------------------------- the format


def test_the_file_flannel_writes() -> None:
    """k3s' conflist, kube-flannel's subnet.env: flannel-io/cni-plugin v1.9.1-flannel1
    flannel_linux.go doCmdAdd, flannel.go delegateAdd and saveScratchNetConf."""
    data = flannel_scratch(FLANNEL_CONF)
    assert data == (
        b'{"cniVersion":"1.0.0","forceAddress":true,"hairpinMode":true,"ipMasq":false,"ipam":{"ranges":'
        b'[[{"subnet":"10.42.0.0/24"}]],"routes":[{"dst":"10.42.0.0/16"}],"type":"host-local"},'
        b'"isDefaultGateway":true,"isGateway":true,"mtu":1450,"name":"cbr0","type":"bridge"}'
    )
    assert parse_delegate(data) == FlannelDelegate("cbr0", "bridge")


def test_the_file_flannel_writes_for_a_dual_stack_node_and_another_delegate() -> None:
    """The same code path: a delegate type of the config's own (no isGateway then), a
    runtimeConfig copied into the delegate (flannel.go cmdAdd), an IPv6 subnet and network."""
    conf = {**FLANNEL_CONF, "delegate": {"type": "ptp"}, "runtimeConfig": {"portMappings": []}}
    data = flannel_scratch(conf, ipv6_network="fd00:42::/56", ipv6_subnet="fd00:42:0:1::1/64", ipmasq=False)
    doc = json.loads(data)
    assert doc["ipam"]["ranges"] == [[{"subnet": "10.42.0.0/24"}], [{"subnet": "fd00:42:0:1::/64"}]]
    assert doc["ipMasq"] is True and "isGateway" not in doc and doc["runtimeConfig"] == {"portMappings": []}
    assert parse_delegate(data) == FlannelDelegate("cbr0", "ptp")


@FUZZ
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_the_parser_takes_any_bytes(data: bytes) -> None:
    try:
        delegate = parse_delegate(data)
    except ValueError:
        return
    assert is_cni_id(delegate.network) and PLUGIN_TYPE.fullmatch(delegate.plugin_type)


# ------------------------------------------------------------------------------------- finding


def test_found_in_the_default_dir_and_in_each_flannel_data_dir_of_the_conf_dir(tmp_path: Path) -> None:
    cni = tmp_path / "cni"
    default = write_private(cni / "flannel", CID, flannel_scratch(FLANNEL_CONF))
    custom_dir = tmp_path / "custom"
    custom = write_private(custom_dir, OTHER, flannel_scratch({**FLANNEL_CONF, "name": "flannel-b"}))
    write_private(tmp_path / "bridge-data", "a" * 64, flannel_scratch(FLANNEL_CONF))
    configs = (
        _conf({"type": "flannel", "dataDir": f"/{custom_dir}/"}),  # cleaned as Go's filepath.Join does
        _conf({"type": "bridge", "dataDir": str(tmp_path / "bridge-data")}, name="other"),  # not flannel's
    )
    files, corrupt = _found(cni, *configs)
    assert corrupt == {}
    assert set(files) == {CID, OTHER}
    one, two = files[CID], files[OTHER]
    assert (one.path, one.root, one.content) == (str(default), str(cni), FlannelDelegate("cbr0", "bridge"))
    assert (two.path, two.root, two.content) == (str(custom), str(custom_dir), FlannelDelegate("flannel-b", "bridge"))
    assert one.mtime == default.stat().st_mtime and one.corrupt is None
    ref = flannel.KIND.ref(one)
    assert (
        ref.kind == "flannel"
        and ref.name == CID
        and ref.identity == flannel.KIND.identity(one) == ("flannel", one.path)
    )
    assert ref.details == {"path": one.path, "network": "cbr0", "type": "bridge"}
    assert flannel.KIND.tie(one) == ContainerTie(CID)


def test_a_data_dir_only_a_cached_config_names_is_never_read(tmp_path: Path) -> None:
    """Whoever can write the cache dir writes what its entries' configs say: a dataDir there
    names nothing the reaper reads (only the node's own conf dir does)."""
    cni = tmp_path / "cni"
    planted = tmp_path / "planted"
    write_private(planted, CID, flannel_scratch(FLANNEL_CONF))
    write_private(cni / "flannel", OTHER, flannel_scratch(FLANNEL_CONF))
    conflist = {"cniVersion": "1.0.0", "name": "cbr0", "plugins": [{"type": "flannel", "dataDir": str(planted)}]}
    entry = cache_doc(CID, "cbr0", config=conflist)
    write_private(cni / "results", f"cbr0-{CID}-eth0", json.dumps(entry).encode())
    taken = take_snapshot(options_at(cni), registry=Registry(kinds=(cache.KIND, flannel.KIND)))
    assert [c.name for c in taken.configs] == ["cbr0"], "the cached config was read"
    assert [f.container_id for f in taken.of("flannel")] == [OTHER]


def test_files_flannel_could_not_have_written_are_still_their_containers(tmp_path: Path) -> None:
    """A crash between flannel's O_TRUNC and its write leaves an empty file; DEL then finds no
    config and does nothing, so the file is its container's, with why it is not a config."""
    bad = {
        "1" * 64: b"",
        "2" * 64: flannel_scratch(FLANNEL_CONF)[:40],
        "3" * 64: b'{"name":"cbr0","type":"\xff"}',
        "4" * 64: b"[" * 100_000,
        "5" * 64: b'["a list"]',
        "6" * 64: b'{"name":"cbr0"}',
        "7" * 64: b'{"name":"cbr0","type":"../../bin/sh"}',
        "8" * 64: b'{"name":"a b","type":"bridge"}',
    }
    for name, data in bad.items():
        write_private(tmp_path / "flannel", name, data)
    files, corrupt = _found(tmp_path)
    assert corrupt == {} and set(files) == set(bad)
    reasons = {name[0]: f.corrupt for name, f in files.items()}
    assert all(f.content is None and flannel.KIND.tie(f) == ContainerTie(f.container_id) for f in files.values())
    assert reasons["1"] == "empty file" and reasons["3"] is not None and "UTF-8" in reasons["3"]
    assert reasons["4"] == "nested too deeply" and reasons["5"] == "not a JSON object"
    assert "delegate type" in str(reasons["6"]) and "delegate type" in str(reasons["7"])
    assert "network name" in str(reasons["8"])
    assert flannel.KIND.ref(files["1" * 64]).details["corrupt"] == "empty file"


def test_entries_that_are_no_containers_file_are_corrupt_never_records(tmp_path: Path) -> None:
    data_dir = tmp_path / "flannel"
    write_private(data_dir, "not an id", flannel_scratch(FLANNEL_CONF))
    write_private(data_dir, ".hidden", flannel_scratch(FLANNEL_CONF))
    fd = os.open(os.fsencode(data_dir) + b"/\xff\xfe" + b"a" * 10, os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    victim = write_private(tmp_path / "victim", "secret", flannel_scratch(FLANNEL_CONF))
    (data_dir / ("1" * 64)).symlink_to(victim)
    write_private(data_dir, "3" * 64, b" " * (5 << 20))
    (data_dir / ("4" * 64)).mkdir()  # nothing flannel makes: passed over
    with watched_fifo(data_dir / ("2" * 64)) as fifo:
        files, corrupt = _found(tmp_path)
        assert not fifo.opened(), "the FIFO was opened: a read of it would wait for a writer"
    assert files == {}
    errors = {os.path.basename(path)[:1]: error for path, error in corrupt.items()}
    assert len(corrupt) == 6
    assert errors["n"] == errors["."] == "file name is not a container ID"
    assert errors["\udcff"] == "file name is not a container ID"
    assert errors["1"] == "symlink, not followed" and errors["2"] == "not a regular file"
    assert "limit" in errors["3"]
    assert victim.exists()


def test_a_symlinked_data_dir_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    write_private(victim, CID, flannel_scratch(FLANNEL_CONF))
    cni = tmp_path / "cni"
    cni.mkdir()
    (cni / "flannel").symlink_to(victim)  # the default dir, beneath the cache dir
    linked = tmp_path / "linked"
    linked.symlink_to(victim)  # a config's dataDir: a root of its own
    files, corrupt = _found(cni, _conf({"type": "flannel", "dataDir": str(linked)}))
    assert files == {}
    assert set(corrupt) == {str(cni / "flannel"), str(linked)}
    assert "is a symlink" in corrupt[str(linked)]


@pytest.mark.parametrize("data_dir", ["relative/dir", "/a\u0000b", "/a\ud800b", "", "/" + "x" * 5000])
def test_a_data_dir_no_path_can_be_is_passed_over(tmp_path: Path, data_dir: str) -> None:
    write_private(tmp_path / "flannel", CID, flannel_scratch(FLANNEL_CONF))
    files, corrupt = _found(tmp_path, _conf({"type": "flannel", "dataDir": data_dir}))
    assert set(files) == {CID} and corrupt == {}


def test_a_data_dir_that_is_or_holds_a_dir_the_reaper_reads_is_not_read(tmp_path: Path) -> None:
    """Files beside the reaper's own roots are not flannel's alone: a config saying `/` (or the
    cache dir, or its parent) must not make every file there named like an ID a flannel file."""
    cni = tmp_path / "cni"
    write_private(cni, CID, b"not flannel's")
    write_private(tmp_path, OTHER, b"not flannel's either")
    configs = [_conf({"type": "flannel", "dataDir": d}) for d in ("/", str(cni), f"{tmp_path}/")]
    files, corrupt = _found(cni, *configs)
    assert files == {}
    assert set(corrupt) == {"/", str(cni), str(tmp_path)}
    assert all("not read" in error for error in corrupt.values())


def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    write_private(tmp_path / "flannel", CID, flannel_scratch(FLANNEL_CONF))
    memo = settled_memo()
    (first,) = flannel.find(look_at(tmp_path, memo=memo)).records
    memo.end_pass()
    (again,) = flannel.find(look_at(tmp_path, memo=memo)).records
    assert again is first


# ----------------------------------------------------------------------------------- reclaiming


def _ctx(quarantine: Quarantine | None = None) -> ReclaimContext:
    return ReclaimContext(
        netns_dirs=(), bin_dirs=(), live_netns=frozenset(), quarantine=quarantine, command_timeout=1.0, done={}
    )


def _judged(cni: Path) -> dict[str, FlannelFile]:
    return {f.container_id: f for f in flannel.find(look_at(cni)).records}


def test_reclaim_removes_the_file_that_was_judged(tmp_path: Path) -> None:
    data_dir = tmp_path / "flannel"
    kept = write_private(data_dir, CID, flannel_scratch(FLANNEL_CONF))
    empty = write_private(data_dir, OTHER, b"")
    judged = _judged(tmp_path)
    done = flannel.KIND.reclaim(list(judged.values()), _ctx())
    assert all(d.ok for d in done.values()) and set(done) == {("flannel", str(kept)), ("flannel", str(empty))}
    assert list(data_dir.iterdir()) == []
    again = flannel.KIND.reclaim(list(judged.values()), _ctx())
    assert all(d.ok for d in again.values()), "already gone: freed"


def test_reclaim_leaves_a_file_replaced_or_rewritten_since_it_was_judged(tmp_path: Path) -> None:
    data_dir = tmp_path / "flannel"
    names = ["1" * 64, "2" * 64, "3" * 64]
    for name in names:
        write_private(data_dir, name, flannel_scratch(FLANNEL_CONF))
    other = write_private(data_dir, OTHER, flannel_scratch({**FLANNEL_CONF, "name": "flannel-b"}))
    judged = _judged(tmp_path)
    replaced, rewritten, renamed_over = (data_dir / n for n in names)
    # Another container's file renamed over it (a new inode, what the name now stands for).
    os.rename(other, renamed_over)
    # Removed and made again with the same bytes and times: another inode.
    st = replaced.stat()
    replaced.unlink()
    replaced.write_bytes(flannel_scratch(FLANNEL_CONF))
    os.utime(replaced, ns=(st.st_atime_ns, st.st_mtime_ns))
    # Written in place: another network's config now.
    rewritten.write_bytes(flannel_scratch({**FLANNEL_CONF, "name": "flannel-b"}))
    done = flannel.KIND.reclaim([judged[n] for n in names], _ctx())
    for name in names:
        result = done[("flannel", str(data_dir / name))]
        assert not result.ok and "since it was judged" in str(result.error)
        assert (data_dir / name).exists()


def test_reclaim_never_follows_a_data_dir_made_a_symlink_since(tmp_path: Path) -> None:
    data_dir = tmp_path / "flannel"
    write_private(data_dir, CID, flannel_scratch(FLANNEL_CONF))
    judged = _judged(tmp_path)[CID]
    victim = tmp_path / "victim"
    data_dir.rename(victim)
    data_dir.symlink_to(victim)
    (result,) = flannel.KIND.reclaim([judged], _ctx()).values()
    assert not result.ok and "cannot re-read" in str(result.error)
    assert (victim / CID).exists()


def test_reclaim_with_a_quarantine_moves_the_file(tmp_path: Path) -> None:
    data = flannel_scratch(FLANNEL_CONF)
    path = write_private(tmp_path / "cni" / "flannel", CID, data)
    judged = _judged(tmp_path / "cni")[CID]
    quarantine = Quarantine(str(tmp_path / "quarantine"))
    (result,) = flannel.KIND.reclaim([judged], _ctx(quarantine)).values()
    assert result.ok and result.quarantined == quarantine.destination(str(path))
    assert not path.exists() and Path(result.quarantined).read_bytes() == data
