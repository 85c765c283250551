"""What flannel's and multus' DEL read from a per-container file: checked by the rules of a
cached config before the node's config runs DEL, and what runs is what was checked."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from reaper.cni.requests import DelRequest
from reaper.kinds import flannel, multus, netns
from reaper.model import Attachment, AttachmentKey, Identity, NetworkConfig
from reaper.reap.delegates import delegations_of, pinned
from reaper.reap.requests import del_request
from reaper.reap.trust import NodeTrust, node_trust
from tests.harness import snapshots
from tests.harness.configs import cache_doc
from tests.harness.fuzz import FUZZ, json_values
from tests.harness.passes import node_config, write_private
from tests.harness.plugin_files import FLANNEL_CONF, MACVLAN_CONFIG, flannel_scratch, multus_delegate, multus_scratch

CID = "f" * 64
HELD = "10.0.0.7"
LIVE_RESULT = {"cniVersion": "1.0.0", "ips": [{"address": f"{HELD}/24"}], "interfaces": [{"name": "vethlive"}]}


def _flannel_config(data_dir: Path, **more: Any) -> NetworkConfig:
    return node_config({"type": "flannel", "dataDir": str(data_dir), **more}, name="cbr0")


def _trust(*configs: NetworkConfig, allowed: tuple[str, ...] = ()) -> NodeTrust:
    return node_trust(configs, allowed, {HELD}, {"vethlive"})


def _request(config: NetworkConfig, ifname: str = "eth0") -> DelRequest:
    return DelRequest(
        container_id=CID, network=config.name, ifname=ifname, netns="", config=config.raw, source=config.path
    )


def _why(config: NetworkConfig, trust: NodeTrust) -> str | None:
    found, why = delegations_of(_request(config), trust)
    assert (found == ()) is (why is not None)
    return why


# ----------------------------------------------------------------------------------- flannel


def test_a_file_as_flannel_writes_it_passes_and_is_what_runs(tmp_path: Path) -> None:
    data = flannel_scratch(FLANNEL_CONF)
    path = write_private(tmp_path / "flannel", CID, data)
    config = _flannel_config(tmp_path / "flannel")
    (found,), why = delegations_of(_request(config), _trust(config))
    assert why is None
    assert (found.plugin_type, found.file.path, found.file.data) == ("flannel", str(path), data)
    assert found.file.stamp is not None and found.file.stamp[1] == path.stat().st_ino


@pytest.mark.parametrize(
    ("delegate", "allowed", "why"),
    [
        ({"type": "firewall", "prevResult": LIVE_RESULT}, ("firewall",), "prevResult"),
        ({"type": "firewall"}, (), "firewall"),
        ({"TYPE": "firewall"}, (), "firewall"),  # Go's decoder reads it as `type`
        ({"type": "bridge", "Type": "firewall"}, ("firewall",), "written twice"),
        ({"type": "bridge", "IPAM": {"type": "evil-ipam"}}, (), "evil-ipam"),
        ({"type": "host-local", "ipam": {"type": "host-local", "dataDir": "/etc"}}, (), "datadir"),
        ({"type": "bridge", "ipam": {"type": "host-local", "DataDir": "/etc"}}, (), "datadir"),
        ({"type": "bridge", "binDir": "/tmp/evil"}, (), "bindir"),
        ({"type": "bridge", "name": ".."}, (), "not a CNI name"),
        ({"type": "bridge", "name": "../../etc"}, (), "not a CNI name"),
        ({"type": "flannel", "dataDir": "/tmp/other"}, (), "another per-container file"),
        ({"type": "multus"}, ("multus",), "another per-container file"),
    ],
)
def test_a_forged_flannel_file_runs_no_plugin(
    tmp_path: Path, delegate: dict[str, Any], allowed: tuple[str, ...], why: str
) -> None:
    doc = {"cniVersion": "1.0.0", "name": "cbr0", **delegate}
    write_private(tmp_path / "flannel", CID, json.dumps(doc).encode())
    config = _flannel_config(tmp_path / "flannel")
    refusal = _why(config, _trust(config, allowed=allowed))
    assert refusal is not None and why in refusal, refusal


def test_what_the_nodes_flannel_config_hands_its_delegate_may_be_in_the_file(tmp_path: Path) -> None:
    """The node's flannel config names the delegate's type and its IPAM dataDir: a file
    holding exactly those passes; another dataDir does not."""
    ipam_dir = str(tmp_path / "leases")
    config = _flannel_config(tmp_path / "flannel", delegate={"type": "ipvlan"}, ipam={"dataDir": ipam_dir})
    trust = _trust(config)
    doc = {"cniVersion": "1.0.0", "name": "cbr0", "type": "ipvlan", "ipam": {"type": "host-local", "dataDir": ipam_dir}}
    write_private(tmp_path / "flannel", CID, json.dumps(doc).encode())
    assert _why(config, trust) is None
    doc["ipam"] = {"type": "host-local", "dataDir": str(tmp_path)}
    write_private(tmp_path / "flannel", CID, json.dumps(doc).encode())
    assert "datadir" in str(_why(config, trust))


@pytest.mark.parametrize("shape", ["not json", "list", "symlink", "fifo", "directory", "huge", "linked dir"])
def test_a_file_that_does_not_parse_or_is_no_regular_file_runs_no_plugin(tmp_path: Path, shape: str) -> None:
    data_dir = tmp_path / "flannel"
    genuine = write_private(tmp_path / "elsewhere", CID, flannel_scratch(FLANNEL_CONF))
    data_dir.mkdir(mode=0o700)
    path = data_dir / CID
    config = _flannel_config(data_dir)
    if shape == "not json":
        path.write_bytes(b"{not json")
    elif shape == "list":
        path.write_bytes(b"[1]")
    elif shape == "symlink":
        path.symlink_to(genuine)
    elif shape == "fifo":
        os.mkfifo(path)
    elif shape == "directory":
        path.mkdir()
    elif shape == "huge":
        path.write_bytes(b" " * (5 << 20))
    else:  # the dataDir itself a link: flannel would follow it
        data_dir.rmdir()
        data_dir.symlink_to(genuine.parent)
    assert _why(config, _trust(config)) is not None


def test_where_flannel_reads_is_where_its_decoder_says() -> None:
    """dataDir as Go's decoder reads it (any case; null keeps the default), joined and cleaned
    as filepath.Join does, relative to / (the plugin's working dir)."""
    assert flannel.scratch_path({}, CID) == f"/var/lib/cni/flannel/{CID}"
    assert flannel.scratch_path({"datadir": None}, CID) == f"/var/lib/cni/flannel/{CID}"
    assert flannel.scratch_path({"datadir": "//x/../y/"}, CID) == f"/y/{CID}"
    assert flannel.scratch_path({"datadir": ""}, CID) == f"/{CID}"
    assert flannel.scratch_path({"datadir": "rel"}, CID) == f"/rel/{CID}"
    with pytest.raises(ValueError):
        flannel.scratch_path({"datadir": 7}, CID)
    assert multus.scratch_path({"cnidir": ""}, CID) == f"/var/lib/cni/multus/{CID}"
    folded_config = node_config({"type": "flannel", "DataDir": "/tmp/reaper-nowhere"}, name="cbr0")
    found, why = delegations_of(_request(folded_config), _trust(folded_config))
    assert why is None and found[0].file.path == f"/tmp/reaper-nowhere/{CID}"


def test_flannel_reads_a_private_copy_of_what_was_checked(tmp_path: Path) -> None:
    """The file swapped for a forged one after the check: flannel's DEL is pointed at a private
    dir holding the checked bytes, so the swap is never read; the dir goes after the DEL."""
    data = flannel_scratch(FLANNEL_CONF)
    original = write_private(tmp_path / "flannel", CID, data)
    config = _flannel_config(tmp_path / "flannel")
    found, _ = delegations_of(_request(config), _trust(config))
    request = DelRequest(
        container_id=CID,
        network="cbr0",
        ifname="eth0",
        netns="",
        config=config.raw,
        source=config.path,
        delegations=found,
    )
    forged = json.dumps({"cniVersion": "1.0.0", "name": "cbr0", "type": "firewall"}).encode()
    original.write_bytes(forged)
    with pinned(request) as (ready, why):
        assert why is None and ready is not None
        (plugin,) = json.loads(ready.config)["plugins"]
        private = Path(plugin["dataDir"])
        assert private.parent.name.startswith("cni-reaper-flannel-")
        assert (private / CID).read_bytes() == data
        assert (private.stat().st_mode & 0o777, (private / CID).stat().st_mode & 0o777) == (0o700, 0o600)
        assert {k for k in plugin if k.casefold() == "datadir"} == {"dataDir"}
    assert not private.parent.exists(), "the private dir outlived the DEL"
    assert original.read_bytes() == forged, "the original is the flannel kind's to remove"


def test_with_no_file_flannel_reads_nothing_even_if_one_appears(tmp_path: Path) -> None:
    (tmp_path / "flannel").mkdir()
    config = _flannel_config(tmp_path / "flannel")
    (found,), why = delegations_of(_request(config), _trust(config))
    assert why is None and found.file.stamp is None
    write_private(tmp_path / "flannel", CID, json.dumps({"name": "cbr0", "type": "firewall"}).encode())
    request = DelRequest(
        container_id=CID,
        network="cbr0",
        ifname="eth0",
        netns="",
        config=config.raw,
        source=config.path,
        delegations=(found,),
    )
    with pinned(request) as (ready, _):
        assert ready is not None
        assert list(Path(json.loads(ready.config)["plugins"][0]["dataDir"]).iterdir()) == []


def test_del_request_runs_no_plugin_for_a_forged_flannel_file(tmp_path: Path) -> None:
    """requests.del_request: the conf dir's flannel config for a dead attachment (a real pin: kernel
    evidence) runs DEL only with a file that passed; the refusal is the plan's note."""
    config = _flannel_config(tmp_path / "flannel")
    (tmp_path / "pin").touch()  # DEL is passed the pin's path, so it must be there
    pin = replace(snapshots.pin(1), path=str(tmp_path / "pin"))
    records: dict[Identity, Any] = {netns.identity(pin): pin}
    attachment = Attachment(
        key=AttachmentKey(CID, "cbr0", "eth0"),
        resources=(netns.ref(pin),),
        netns=pin.ns,
        verdict="orphan",
        reason="",
        age_seconds=0.0,
    )
    write_private(tmp_path / "flannel", CID, flannel_scratch(FLANNEL_CONF))
    request, note = del_request(attachment, records, [config], _trust(config))
    assert request is not None and note is None and [d.plugin_type for d in request.delegations] == ["flannel"]
    forged = {"cniVersion": "1.0.0", "name": "cbr0", "type": "firewall", "prevResult": LIVE_RESULT}
    write_private(tmp_path / "flannel", CID, json.dumps(forged).encode())
    request, note = del_request(attachment, records, [config], _trust(config, allowed=("firewall",)))
    assert request is None and note is not None and note.startswith("delegate file not run:"), note


# ------------------------------------------------------------------------------------ multus


def _multus_setup(tmp_path: Path, delegates: list[dict[str, Any]]) -> tuple[NetworkConfig, NetworkConfig, Path]:
    """The thin plugin's config (cniDir in tmp_path), the cluster network's conflist in the conf
    dir (flannel, its dataDir in tmp_path, and portmap), and multus' file for CID."""
    cni_dir = tmp_path / "multus"
    multus_conf = node_config({"type": "multus", "cniDir": str(cni_dir)}, name="multus-cni-network")
    cluster = node_config({"type": "flannel", "dataDir": str(tmp_path / "flannel")}, {"type": "portmap"}, name="cbr0")
    path = write_private(cni_dir, CID, multus_scratch(delegates))
    return multus_conf, cluster, path


def _cluster_delegate(cluster: NetworkConfig) -> dict[str, Any]:
    return multus_delegate(cluster.raw)


def test_a_file_as_multus_writes_it_passes_and_each_file_it_reads_is_pinned(tmp_path: Path) -> None:
    """The cluster network (flannel, whose own file is checked too) and a macvlan
    net-attach-def, with --allow-plugin for macvlan and its host-local (no conf dir config
    uses them)."""
    cluster = node_config({"type": "flannel", "dataDir": str(tmp_path / "flannel")}, {"type": "portmap"}, name="cbr0")
    delegates = [_cluster_delegate(cluster), multus_delegate(MACVLAN_CONFIG, ("default", "macvlan-conf"))]
    conf, cluster, path = _multus_setup(tmp_path, delegates)
    inner = write_private(tmp_path / "flannel", CID, flannel_scratch(FLANNEL_CONF))
    result = write_private(
        tmp_path / "multus" / "results", f"cbr0-{CID}-eth0", json.dumps(cache_doc(CID, "cbr0")).encode()
    )
    refusal = _why(conf, _trust(conf, cluster))
    assert refusal is not None and "macvlan" in refusal
    (found,), why = delegations_of(_request(conf), _trust(conf, cluster, allowed=("macvlan", "host-local")))
    assert why is None and found.file.path == str(path)
    pinned_paths = {f.path: f.stamp is not None for f in found.results}
    assert pinned_paths == {
        str(result): True,
        str(inner): True,
        str(tmp_path / "multus" / "results" / f"macvlan-conf-{CID}-net1"): False,
    }


@pytest.mark.parametrize(
    ("delegate_conf", "cached", "why"),
    [
        # firewall DELs by prevResult: libcni hands it the cached result of its network.
        ({"name": "cbr0", "type": "firewall"}, LIVE_RESULT, f"prevResult names '{HELD}"),
        ({"name": "cbr0", "type": "firewall"}, {"kind": "cniCacheV1", "result": LIVE_RESULT}, f"names '{HELD}"),
        ({"name": "cbr0", "type": "firewall", "prevResult": LIVE_RESULT}, None, f"names '{HELD}"),
        ({"name": "cbr0", "type": "host-local", "ipam": {"type": "host-local", "dataDir": "/etc"}}, None, "datadir"),
        ({"name": "cbr0", "type": "multus"}, None, "another per-container file"),
        ({"name": "cbr0", "type": "firewall", "prevResult": {"ips": 5}}, None, "cannot be read as a result"),
        (
            {"name": "cbr0", "type": "firewall"},
            {"interfaces": [{"name": ["unhashable"]}]},
            "cannot be read as a result",
        ),
        ({"name": "../../etc", "type": "firewall"}, None, "no CNI name"),
    ],
)
def test_a_forged_multus_delegate_runs_no_plugin(
    tmp_path: Path, delegate_conf: dict[str, Any], cached: dict[str, Any] | None, why: str
) -> None:
    delegate = multus_delegate(json.dumps({"cniVersion": "1.0.0", **delegate_conf}).encode())
    conf, cluster, _ = _multus_setup(tmp_path, [delegate])
    if cached is not None:
        write_private(tmp_path / "multus" / "results", f"cbr0-{CID}-eth0", json.dumps(cached).encode())
    refusal = _why(conf, _trust(conf, cluster, allowed=("firewall", "host-local", "multus")))
    assert refusal is not None and why in refusal, refusal


def test_a_forged_file_beside_multus_runs_no_plugin(tmp_path: Path) -> None:
    """A cached result linked elsewhere, an interface request that is a path, a file that is no
    delegate list: no plugin."""
    cluster = node_config({"type": "portmap"}, name="cbr0")
    conf, cluster, path = _multus_setup(tmp_path, [_cluster_delegate(cluster)])
    (tmp_path / "multus" / "results").mkdir()
    (tmp_path / "multus" / "results" / f"cbr0-{CID}-eth0").symlink_to("/etc/hostname")
    assert "cannot be read" in str(_why(conf, _trust(conf, cluster)))
    path.write_bytes(multus_scratch([{**_cluster_delegate(cluster), "ifnameRequest": "../x"}]))
    assert "interface name" in str(_why(conf, _trust(conf, cluster)))
    path.write_bytes(b'{"Name": "cbr0"}')
    assert _why(conf, _trust(conf, cluster)) is not None


def test_multus_runs_nothing_when_a_file_it_reads_changed_since_the_check(tmp_path: Path) -> None:
    cluster = node_config({"type": "flannel", "dataDir": str(tmp_path / "flannel")}, {"type": "portmap"}, name="cbr0")
    conf, cluster, path = _multus_setup(tmp_path, [_cluster_delegate(cluster)])
    inner = write_private(tmp_path / "flannel", CID, flannel_scratch(FLANNEL_CONF))
    found, why = delegations_of(_request(conf), _trust(conf, cluster))
    assert why is None
    request = DelRequest(
        container_id=CID,
        network=conf.name,
        ifname="eth0",
        netns="",
        config=conf.raw,
        source=conf.path,
        delegations=found,
    )
    with pinned(request) as (ready, why):
        assert ready == request and why is None, "unchanged: runs as checked"
    forged = {"cniVersion": "1.0.0", "name": "cbr0", "type": "firewall", "prevResult": LIVE_RESULT}
    for changed, data in (
        (inner, json.dumps(forged).encode()),
        (path, multus_scratch([multus_delegate(json.dumps(forged).encode())])),
    ):
        kept = changed.read_bytes()
        changed.write_bytes(data)
        with pinned(request) as (ready, why):
            assert ready is None and why is not None and "changed since it was checked" in why
        changed.write_bytes(kept)
        with pinned(request) as (ready, why):
            assert ready is None, "the same bytes written again: still not the file checked"
    found, _ = delegations_of(_request(conf), _trust(conf, cluster))
    request = DelRequest(
        container_id=CID,
        network=conf.name,
        ifname="eth0",
        netns="",
        config=conf.raw,
        source=conf.path,
        delegations=found,
    )
    result = tmp_path / "multus" / "results" / f"cbr0-{CID}-eth0"
    write_private(result.parent, result.name, json.dumps(LIVE_RESULT).encode())
    with pinned(request) as (ready, why):
        assert ready is None and why is not None and "appeared since it was checked" in why


# ---------------------------------------------------------------------------------- any bytes


_SHAPES = st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode())
_DELEGATE = st.fixed_dictionaries(
    {"name": st.just("cbr0"), "type": st.sampled_from(["bridge", "firewall"])},
    optional={"prevResult": json_values, "ipam": json_values, "IPAM": json_values, "Type": json_values},
)


@FUZZ
@given(data=_SHAPES | _DELEGATE.map(lambda d: json.dumps(d).encode()))
def test_any_flannel_file_is_a_check_or_a_refusal(data: bytes) -> None:
    """Whatever a writer puts there, the check answers: one bad file is never a failed pass."""
    with tempfile.TemporaryDirectory() as tmp:
        write_private(Path(tmp) / "flannel", CID, data)
        config = _flannel_config(Path(tmp) / "flannel")
        found, why = delegations_of(_request(config), _trust(config, allowed=("firewall",)))
        assert (found == ()) is (why is not None)


def _raw_delegate(config: dict[str, Any]) -> dict[str, Any]:
    """A delegate as multus saves it, for any config (multus_delegate decodes the config)."""
    return {"Name": "x", "ConfList": {}, "Bytes": base64.b64encode(json.dumps(config).encode()).decode()}


@FUZZ
@given(
    data=_SHAPES | st.lists(_DELEGATE.map(_raw_delegate), min_size=1, max_size=3).map(multus_scratch),
    result=_SHAPES,
)
def test_any_multus_file_or_cached_result_is_a_check_or_a_refusal(data: bytes, result: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = node_config({"type": "portmap"}, name="cbr0")
        conf, cluster, path = _multus_setup(Path(tmp), [])
        path.write_bytes(data)
        write_private(Path(tmp) / "multus" / "results", f"cbr0-{CID}-eth0", result)
        found, why = delegations_of(_request(conf), _trust(conf, cluster, allowed=("firewall", "bridge")))
        assert (found == ()) is (why is not None)
