"""multus' per-container files and its delegates' results: the bytes multus writes, where it
writes them, hostile ones, and the compare before each one is removed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.host.quarantine import Quarantine
from reaper.kinds import ReclaimContext, cache, multus
from reaper.kinds.multus import MultusDelegates, MultusFile, parse_delegates
from reaper.kinds.netconf import parse_network_config
from reaper.model import ContainerTie, NetworkConfig, OwnKey
from tests.harness.configs import cache_doc
from tests.harness.fuzz import FUZZ, json_values
from tests.harness.passes import look_at, write_private
from tests.harness.plugin_files import (
    CLUSTER_CONFLIST,
    MACVLAN_CONFIG,
    multus_delegate,
    multus_pod_scratch,
    multus_scratch,
)

CID = "d" * 64
OTHER = "c" * 64
POD = MultusDelegates(2, ("cbr0", "default/macvlan-conf"))


def _multus_conf(**more: object) -> NetworkConfig:
    """The thin plugin's 00-multus.conf (multus-cni docs/configuration.md), with `more`."""
    doc = {"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus", "clusterNetwork": "cbr0", **more}
    return parse_network_config(json.dumps(doc).encode(), "/etc/cni/net.d/00-multus.conf")


def _found(cache_dir: Path, *configs: NetworkConfig) -> tuple[dict[str, MultusFile], dict[str, str]]:
    found = multus.find(look_at(cache_dir, *configs))
    return {f.container_id: f for f in found.records}, {c.path: c.error for c in found.corrupt}


# ---------------------------------------------------------------------------------- the format


@pytest.mark.parametrize("v3", [False, True], ids=["v4.3.0", "v3.9.3"])
def test_the_file_multus_writes(v3: bool) -> None:
    """A pod on the cluster network with one net-attach-def: multus-cni pkg/multus/multus.go
    saveDelegates of the delegates pkg/types/conf.go LoadDelegateNetConf made; v4.3.0 (cni
    v1.3.0: CNINetworkConfigList, PluginConf's MarshalJSON) and v3.9.3 (cni v0.8.1)."""
    data = multus_pod_scratch(v3=v3)
    doc = json.loads(data)
    assert [d["Name"] for d in doc] == ["cbr0", "default/macvlan-conf"]
    assert ("CNINetworkConfigList" in doc[0]) is not v3
    assert parse_delegates(data) == POD


def test_a_delegate_with_an_interface_request() -> None:
    data = multus_scratch([multus_delegate(CLUSTER_CONFLIST), multus_delegate(MACVLAN_CONFIG, ("ns", "m"), "macvlan0")])
    assert json.loads(data)[1]["ifnameRequest"] == "macvlan0"
    assert parse_delegates(data) == MultusDelegates(2, ("cbr0", "ns/m"))


def test_a_file_of_very_many_delegates_keeps_a_bounded_record() -> None:
    data = multus_scratch([multus_delegate(MACVLAN_CONFIG, ("ns", "x" * 5000))] * 200)
    parsed = parse_delegates(data)
    assert parsed.count == 200 and len(parsed.names) == multus.MAX_KEPT_NAMES
    assert all(len(n) == multus.MAX_KEPT_NAME for n in parsed.names)


@FUZZ
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_the_parser_takes_any_bytes(data: bytes) -> None:
    try:
        parsed = parse_delegates(data)
    except ValueError:
        return
    assert parsed.count >= 1 and all(isinstance(n, str) for n in parsed.names)


# ------------------------------------------------------------------------------------- finding


def test_found_in_the_default_dir_and_each_cni_dir_of_the_conf_dir(tmp_path: Path) -> None:
    cni = tmp_path / "cni"
    default = write_private(cni / "multus", CID, multus_pod_scratch())
    (cni / "multus" / "results").mkdir()  # the delegates' cache: passed over, not corrupt
    custom_dir = tmp_path / "multus-custom"
    custom = write_private(custom_dir, OTHER, multus_pod_scratch(v3=True))
    files, corrupt = _found(cni, _multus_conf(cniDir=str(custom_dir)))
    assert corrupt == {} and set(files) == {CID, OTHER}
    one, two = files[CID], files[OTHER]
    assert (one.path, one.root, one.content) == (str(default), str(cni), POD)
    assert (two.path, two.root, two.content) == (str(custom), str(custom_dir), POD)
    ref = multus.KIND.ref(one)
    assert ref.name == CID and ref.identity == ("multus", one.path) == multus.KIND.identity(one)
    assert ref.details == {"path": one.path, "delegates": 2, "networks": "cbr0,default/macvlan-conf"}
    assert multus.KIND.tie(one) == ContainerTie(CID)


def test_the_thick_plugins_shim_config_names_the_daemons_cni_dir(tmp_path: Path) -> None:
    custom_dir = tmp_path / "multus-thick"
    write_private(custom_dir, CID, multus_pod_scratch())
    shim = {"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus-shim", "cniDir": str(custom_dir)}
    config = parse_network_config(json.dumps(shim).encode(), "/etc/cni/net.d/00-multus.conf")
    files, _ = _found(tmp_path / "cni", config)
    assert set(files) == {CID}


def test_a_cni_dir_only_a_cached_config_names_is_never_read(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    write_private(planted, CID, multus_pod_scratch())
    cached = {"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus", "cniDir": str(planted)}
    entry = cache_doc(CID, "multus-cni-network", config=cached)
    write_private(tmp_path / "cni" / "results", f"multus-cni-network-{CID}-eth0", json.dumps(entry).encode())
    look = look_at(tmp_path / "cni")
    assert [c.name for c in cache.find(look).configs] == ["multus-cni-network"], "the cached config was read"
    assert multus.find(look).records == ()


def test_unreadable_and_hostile_files(tmp_path: Path) -> None:
    data_dir = tmp_path / "multus"
    records = {
        "1" * 64: b"",
        "2" * 64: b"[]",
        "3" * 64: b"[1, 2]",
        "4" * 64: b'[{"Name": 7}]',
        "5" * 64: b"[" * 100_000,
        "6" * 64: b'[{"Name":"\xff"}]',
        "7" * 64: b'{"Name":"cbr0"}',
    }
    for name, data in records.items():
        write_private(data_dir, name, data)
    write_private(data_dir, "not-an-id!", multus_pod_scratch())
    write_private(tmp_path / "victim", "x", multus_pod_scratch())
    (data_dir / ("8" * 64)).symlink_to(tmp_path / "victim" / "x")
    os.mkfifo(data_dir / ("9" * 64))
    write_private(data_dir, "a" * 64, b" " * (5 << 20))
    files, corrupt = _found(tmp_path)
    assert set(files) == set(records) and all(f.content is None and f.corrupt for f in files.values())
    assert files["1" * 64].corrupt == "empty file" and files["5" * 64].corrupt == "nested too deeply"
    errors = {os.path.basename(p)[:1]: e for p, e in corrupt.items()}
    assert errors == {
        "n": "file name is not a container ID",
        "8": "symlink, not followed",
        "9": "not a regular file",
        "a": errors["a"],
    }
    assert "limit" in errors["a"]


def test_a_symlinked_multus_dir_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    write_private(victim, CID, multus_pod_scratch())
    write_private(
        victim / "results", f"macvlan-conf-{CID}-net1", json.dumps(cache_doc(CID, "macvlan-conf", "net1")).encode()
    )
    cni = tmp_path / "cni"
    cni.mkdir()
    (cni / "multus").symlink_to(victim)
    files, corrupt = _found(cni)
    assert files == {} and list(corrupt) == [str(cni / "multus")]
    inventory = cache.find(look_at(cni))
    assert inventory.records == () and [c.path for c in inventory.corrupt] == [str(cni / "multus" / "results")]


# ------------------------------------------------------------------------ the delegates' results


def test_the_delegates_results_are_cache_entries_judged_by_container_id(tmp_path: Path) -> None:
    """multus runs each delegate through libcni with its cniDir as the cache dir:
    `<cniDir>/results/<network>-<container ID>-<ifname>`, net1 the first secondary."""
    cni = tmp_path / "cni"
    results = cni / "multus" / "results"
    write_private(results, f"macvlan-conf-{CID}-net1", json.dumps(cache_doc(CID, "macvlan-conf", "net1")).encode())
    write_private(results, f"cbr0-{CID}-eth0", json.dumps(cache_doc(CID, "cbr0")).encode())
    custom_dir = tmp_path / "multus-custom"
    write_private(custom_dir / "results", f"sriov-{OTHER}-net1", json.dumps(cache_doc(OTHER, "sriov", "net1")).encode())
    found = cache.find(look_at(cni, _multus_conf(cniDir=str(custom_dir))))
    assert found.corrupt == ()
    ties = {cache.tie(e) for e in found.records}
    assert ties == {
        OwnKey(container_id=CID, network="macvlan-conf", ifname="net1"),
        OwnKey(container_id=CID, network="cbr0", ifname="eth0"),
        OwnKey(container_id=OTHER, network="sriov", ifname="net1"),
    }
    roots = {e.network: e.cache_dir for e in found.records}
    assert roots == {"macvlan-conf": str(cni), "cbr0": str(cni), "sriov": str(custom_dir)}
    done = cache.reclaim(
        found.records,
        ReclaimContext(
            netns_dirs=(), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=1.0, done={}
        ),
    )
    assert all(d.ok for d in done.values()) and list(results.iterdir()) == []
    assert list((custom_dir / "results").iterdir()) == []


def test_a_corrupt_result_of_a_custom_cni_dir_is_named_beneath_that_dir(tmp_path: Path) -> None:
    custom_dir = tmp_path / "multus-custom"
    path = write_private(custom_dir / "results", f"sriov-{OTHER}-net1", b"")
    conf = parse_network_config(
        json.dumps({"cniVersion": "1.0.0", "name": "sriov", "type": "sriov"}).encode(), "/etc/cni/net.d/sriov.conf"
    )
    (entry,) = cache.find(look_at(tmp_path / "cni", _multus_conf(cniDir=str(custom_dir)), conf)).records
    assert (entry.path, entry.cache_dir, entry.corrupt) == (str(path), str(custom_dir), "empty file")


# ----------------------------------------------------------------------------------- reclaiming


def _ctx(quarantine: Quarantine | None = None) -> ReclaimContext:
    return ReclaimContext(
        netns_dirs=(), bin_dirs=(), live_netns=frozenset(), quarantine=quarantine, command_timeout=1.0, done={}
    )


def test_reclaim_removes_the_judged_file_and_leaves_one_changed_since(tmp_path: Path) -> None:
    data_dir = tmp_path / "multus"
    gone = write_private(data_dir, CID, multus_pod_scratch())
    changed = write_private(data_dir, OTHER, multus_pod_scratch())
    judged = {f.container_id: f for f in multus.find(look_at(tmp_path)).records}
    changed.write_bytes(multus_scratch([multus_delegate(CLUSTER_CONFLIST)]))
    done = multus.KIND.reclaim(list(judged.values()), _ctx())
    assert done[("multus", str(gone))].ok and not gone.exists()
    left = done[("multus", str(changed))]
    assert not left.ok and "since it was judged" in str(left.error) and changed.exists()


def test_reclaim_into_the_quarantine(tmp_path: Path) -> None:
    path = write_private(tmp_path / "multus", CID, b"[]")  # judged corrupt, and still the same file
    (judged,) = multus.find(look_at(tmp_path)).records
    quarantine = Quarantine(str(tmp_path / "q"))
    (result,) = multus.KIND.reclaim([judged], _ctx(quarantine)).values()
    assert result.ok and result.quarantined is not None and Path(result.quarantined).read_bytes() == b"[]"
    assert not path.exists()
