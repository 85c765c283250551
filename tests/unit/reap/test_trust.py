"""Whether a cache entry's config may run as root: each rule, and a forged config of each kind."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reaper.kinds.netconf import parse_network_config
from reaper.model import Attachment, AttachmentKey, ResourceRef
from reaper.reap.trust import cached_config_refusal, node_trust
from tests.harness.configs import conflist

CID = "a" * 64
OWN = json.loads(conflist("net1"))


def _attachment(*kinds: str) -> Attachment:
    refs = tuple(ResourceRef(kind, f"{kind}-x", None) for kind in kinds)
    return Attachment(AttachmentKey(CID, "net1", "eth0"), refs, None, "orphan", "", 0.0)


def _trust(
    allowed: tuple[str, ...] = (), ips: set[str] | None = None, ifnames: set[str] | None = None, conf: Any = OWN
) -> Any:
    own = parse_network_config(json.dumps(conf).encode(), "/etc/cni/net.d/10-net1.conflist")
    return node_trust([own], allowed, ips or set(), ifnames or set())


def _with(**changes: Any) -> bytes:
    config = json.loads(json.dumps(OWN))
    for plugin in config["plugins"]:
        if plugin["type"] == "bridge":
            plugin.update(changes)
    return json.dumps(config).encode()


def test_the_nodes_own_config_with_a_corroborated_entry_runs() -> None:
    assert cached_config_refusal(_attachment("cache", "ipam"), json.dumps(OWN).encode(), None, _trust()) is None


def test_an_entry_nothing_else_names_never_runs() -> None:
    why = cached_config_refusal(_attachment("cache"), json.dumps(OWN).encode(), None, _trust())
    assert why is not None and "nothing on the node" in why


def test_a_plugin_the_conf_dir_does_not_use_never_runs_unless_allowed() -> None:
    forged = json.loads(json.dumps(OWN))
    forged["plugins"].append({"type": "firewall"})
    raw = json.dumps(forged).encode()
    why = cached_config_refusal(_attachment("cache", "veth"), raw, None, _trust())
    assert why is not None and "firewall" in why
    assert cached_config_refusal(_attachment("cache", "veth"), raw, None, _trust(allowed=("firewall",))) is None
    ipam = _with(ipam={"type": "evil-ipam"})
    why = cached_config_refusal(_attachment("cache", "veth"), ipam, None, _trust())
    assert why is not None and "evil-ipam" in why, "an IPAM plugin is executed too"


@pytest.mark.parametrize(
    "changes",
    [
        {"binDir": "/var/lib/cni/evil"},
        {"ipam": {"type": "host-local", "dataDir": "/etc", "ranges": [[{"subnet": "10.88.0.0/24"}]]}},
        {"socketPath": "relative.sock"},
        {"delegates": [{"conf": "../../etc/shadow"}]},
        {"kubeconfig": "/root/.kube/config"},
        {"extra": ["/proc/1/root/etc"]},
    ],
)
def test_a_path_or_steering_key_the_conf_dir_does_not_hold_never_runs(changes: dict[str, Any]) -> None:
    why = cached_config_refusal(_attachment("cache", "netns"), _with(**changes), None, _trust())
    assert why is not None and "not what the conf dir's config says" in why


def test_the_same_path_as_the_conf_dir_holds_runs() -> None:
    conf = json.loads(conflist("net1", dataDir="/var/lib/cni/networks"))
    raw = json.dumps(conf).encode()
    assert cached_config_refusal(_attachment("cache", "ipam"), raw, None, _trust(conf=conf)) is None
    why = cached_config_refusal(_attachment("cache", "ipam"), raw, None, _trust())
    assert why is not None and "dataDir" in why


def test_a_prev_result_naming_what_a_live_attachment_holds_never_runs() -> None:
    raw = json.dumps(OWN).encode()
    result = {"cniVersion": "1.0.0", "ips": [{"address": "10.88.0.7/24"}], "interfaces": [{"name": "vethabc"}]}
    why = cached_config_refusal(_attachment("cache", "ipam"), raw, result, _trust(ips={"10.88.0.7"}))
    assert why is not None and "10.88.0.7" in why
    why = cached_config_refusal(_attachment("cache", "ipam"), raw, result, _trust(ifnames={"vethabc"}))
    assert why is not None and "vethabc" in why
    sandboxed = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}]}
    assert cached_config_refusal(_attachment("cache", "ipam"), raw, sandboxed, _trust(ifnames={"eth0"})) is None
    assert cached_config_refusal(_attachment("cache", "ipam"), raw, result, _trust(ips={"10.88.0.8"})) is None


def test_a_hostile_config_shape_is_refused_not_raised() -> None:
    for raw in (b"[" * 5000, b'{"name": "net1", "plugins": [1]}', b"\xff", b'{"name": "net1", "type": "x", "a": {}}'):
        why = cached_config_refusal(_attachment("cache", "ipam"), raw, {"ips": "x", "interfaces": [1]}, _trust())
        assert why is not None


def test_files_written_beside_the_cache_entry_corroborate_nothing() -> None:
    """Flannel's and multus' files sit in the cache dir too: whoever forged the entry could
    forge them."""
    raw = json.dumps(OWN).encode()
    why = cached_config_refusal(_attachment("cache", "flannel", "multus"), raw, None, _trust())
    assert why is not None and "nothing on the node" in why
    assert cached_config_refusal(_attachment("cache", "flannel", "veth"), raw, None, _trust()) is None
