"""Whether a plugin may run for an attachment, and with a cache entry's config: each rule, and a
forged file of each kind."""

from __future__ import annotations

import json
from typing import Any

import pytest
from msgspec.structs import replace

from reaper.kinds.netconf import parse_network_config
from reaper.model import Attachment, AttachmentKey, Identity, NsKey, ResourceRef
from reaper.reap.trust import cached_config_refusal, kernel_proven, node_trust, proven_namespaces
from tests.harness import snapshots
from tests.harness.configs import conflist

CID = "a" * 64
OWN = json.loads(conflist("net1"))


def _attachment(*kinds: str) -> Attachment:
    refs = tuple(ResourceRef(kind=kind, name=f"{kind}-x", created_at=None) for kind in kinds)
    return Attachment(
        key=AttachmentKey(CID, "net1", "eth0"), resources=refs, netns=None, verdict="orphan", reason="", age_seconds=0.0
    )


def _trust(
    allowed: tuple[str, ...] = (),
    ips: set[str] | None = None,
    ifnames: set[str] | None = None,
    conf: Any = OWN,
    proven: dict[str, frozenset[NsKey]] | None = None,
) -> Any:
    own = parse_network_config(json.dumps(conf).encode(), "/etc/cni/net.d/10-net1.conflist")
    return node_trust([own], allowed, ips or set(), ifnames or set(), proven=proven)


def _with(**changes: Any) -> bytes:
    config = json.loads(json.dumps(OWN))
    for plugin in config["plugins"]:
        if plugin["type"] == "bridge":
            plugin.update(changes)
    return json.dumps(config).encode()


def test_the_nodes_own_config_with_a_corroborated_entry_runs() -> None:
    assert cached_config_refusal(_attachment("cache", "ipam"), json.dumps(OWN).encode(), None, _trust()) is None


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


# What each kind's record is, for the kernel rule: the files any writer of /var/lib/cni makes,
# the chains and rules (reclaimed by their hash, never a proof), and the kernel's own objects.
FILES: dict[str, Any] = {
    "cache": snapshots.cache(1),
    "ipam": snapshots.lease(1),
    "flannel": object(),
    "multus": object(),
    "tuning": object(),
    "iptables": snapshots.chain(1),
    "firewall": object(),
    "nft": object(),
}
NETNS = NsKey(4, 1001)


def _made_of(records: dict[str, Any], netns: NsKey | None = NETNS, cid: str = CID) -> tuple[Attachment, Any]:
    refs = tuple(
        ResourceRef(kind=kind, name=f"{kind}-x", created_at=None, details={}, identity=(kind, "x")) for kind in records
    )
    index: dict[Identity, Any] = {(kind, "x"): record for kind, record in records.items()}
    return Attachment(
        key=AttachmentKey(cid, "net1", "eth0"),
        resources=refs,
        netns=netns,
        verdict="orphan",
        reason="",
        age_seconds=0.0,
    ), index


def test_files_written_beside_the_cache_entry_corroborate_nothing() -> None:
    """Cache entries, leases, flannel's, multus' and tuning's files are all written by whoever can
    write /var/lib/cni: no number of them proves an attachment, nor do chains or rules. A real
    pin does, and so does a veth whose peer is in the attachment's namespace."""
    trust = _trust()
    attachment, records = _made_of(FILES)
    assert not kernel_proven(attachment, records, trust)
    stale = replace(snapshots.pin(1), is_namespace=False)
    attachment, records = _made_of({**FILES, "netns": stale})
    assert not kernel_proven(attachment, records, trust), "a plain file in the netns dir is a file"
    attachment, records = _made_of({**FILES, "netns": snapshots.pin(1)})
    assert kernel_proven(attachment, records, trust)
    attachment, records = _made_of({**FILES, "veth": snapshots.veth(1)})
    assert kernel_proven(attachment, records, trust)
    attachment, records = _made_of({**FILES, "veth": snapshots.veth(2)})
    assert not kernel_proven(attachment, records, trust), "its peer is in another namespace"
    attachment, records = _made_of({**FILES, "veth": snapshots.veth(1, resolved=False)})
    assert not kernel_proven(attachment, records, trust), "its peer is in no namespace the reaper knows"


def test_a_containers_other_attachment_is_proven_by_its_pin_only_in_that_namespace() -> None:
    """A pod's lo (or eth1) holds no pin of its own: the pin joined its first attachment. It is
    proven when its namespace is the one a real pin of the same container holds."""
    primary, records = _made_of({"netns": snapshots.pin(1), "cache": snapshots.cache(1)})
    proven = proven_namespaces([primary], records)
    assert proven == {CID: frozenset({NETNS})}
    trust = _trust(proven=proven)
    second, files = _made_of({"cache": snapshots.cache(1)})
    assert kernel_proven(second, files, trust)
    elsewhere, files = _made_of({"cache": snapshots.cache(1)}, netns=NsKey(4, 1002))
    assert not kernel_proven(elsewhere, files, trust)
    other, files = _made_of({"cache": snapshots.cache(1)}, cid="b" * 64)
    assert not kernel_proven(other, files, trust), "another container's pin proves nothing of it"
    nowhere, files = _made_of({"cache": snapshots.cache(1)}, netns=None)
    assert not kernel_proven(nowhere, files, trust)


LIVE_V4, LIVE_V6 = "10.88.0.7", "fd00::5"


@pytest.mark.parametrize(
    "result",
    [
        {"ips": [{"address": "::ffff:10.88.0.7/120"}]},
        {"ips": [{"address": "::FFFF:a58:7/120"}]},
        {"IPs": [{"Address": "10.88.0.7/24"}]},
        {"IPS": [{"ADDRESS": "10.88.0.7/24"}]},
        {"ip\u017f": [{"addre\u017f\u017f": "10.88.0.7/24"}]},  # LONG S folds onto s in Go
        {"ips": [{"address": "10.0.0.1/24"}], "Ips": [{"address": "10.88.0.7/24"}]},
        {"ips": [{"address": "10.0.0.1/24", "Address": "10.88.0.7/24"}]},
        {"ips": [{"address": "FD00::5/64"}]},
        {"ips": [{"address": "fd00:0:0:0:0:0:0:5/64"}]},
        {"ips": [{"address": "fd00:0000::0005/64"}]},
        {"ips": [{"address": "fd00::5%eth0/64"}]},
        {"ips": [{"address": "fd00::5"}]},
        {"ips": [{"address": "10.88.0.7"}]},
    ],
)
def test_a_prev_result_naming_a_held_address_in_any_spelling_never_runs(result: dict[str, Any]) -> None:
    """Go decodes `IPs`, `Address` (any case, and U+017F for s) into the same fields, and
    net.ParseCIDR reads an IPv4-mapped address as its IPv4 one: each spelling is the live pod's
    address to the firewall plugin, so each is refused."""
    raw = json.dumps(OWN).encode()
    why = cached_config_refusal(_attachment("cache", "netns"), raw, result, _trust(ips={LIVE_V4, LIVE_V6}))
    assert why is not None and "an address an attachment in use holds" in why, result


@pytest.mark.parametrize("held", ["::ffff:10.88.0.7", "10.88.0.7", "0:0:0:0:0:ffff:a58:7"])
def test_held_addresses_are_compared_by_meaning_too(held: str) -> None:
    """The held side (a lease's name, a cache entry's address) is folded the same way."""
    result = {"ips": [{"address": "10.88.0.7/24"}]}
    why = cached_config_refusal(_attachment("cache", "netns"), json.dumps(OWN).encode(), result, _trust(ips={held}))
    assert why is not None and "10.88.0.7" in why


@pytest.mark.parametrize(
    "result",
    [
        [],
        "10.88.0.7",
        {"ips": {"address": "10.88.0.7/24"}},
        {"ips": ["10.88.0.7/24"]},
        {"ips": [{"address": 1}]},
        {"ips": [{"address": "10.88.0.300/24"}]},
        {"ips": [{"address": "10.88.0.7/24x"}]},
        {"ips": [{"gateway": "10.88.0.1"}]},
        {"ips": [], "IPS": "x"},
        {"interfaces": {"name": "vethabc"}},
        {"interfaces": [{"name": 7}]},
        {"interfaces": [{"name": "vethabc", "sandbox": False}]},
    ],
)
def test_a_prev_result_that_does_not_read_as_a_result_is_refused(result: Any) -> None:
    why = cached_config_refusal(_attachment("cache", "netns"), json.dumps(OWN).encode(), result, _trust())
    assert why is not None and "cannot be read as a result" in why, result


def test_interfaces_are_matched_by_name_under_any_spelling_of_their_keys() -> None:
    raw = json.dumps(OWN).encode()
    trust = _trust(ifnames={"vethabc"})
    for result in (
        {"Interfaces": [{"Name": "vethabc"}]},
        {"interfaces": [{"NAME": "vethabc", "Sandbox": ""}]},
        {"interfaces": [{"name": "vethabc", "sandbox": "/run/netns/x", "SANDBOX": ""}]},
    ):
        why = cached_config_refusal(_attachment("cache", "netns"), raw, result, trust)
        assert why is not None and "vethabc" in why, result
    sandboxed = {"interfaces": [{"Name": "vethabc", "Sandbox": "/run/netns/x"}], "ips": [{"address": "10.9.0.1/24"}]}
    assert cached_config_refusal(_attachment("cache", "netns"), raw, sandboxed, trust) is None
    assert cached_config_refusal(_attachment("cache", "netns"), raw, {"cniVersion": "1.0.0"}, trust) is None


def test_an_ipam_plugin_under_another_spelling_of_the_key_is_executed_too() -> None:
    """The bridge plugin decodes `IPAM` into its ipam field as it does `ipam`: the IPAM plugin it
    would run is weighed whichever spelling names it."""
    forged = json.loads(json.dumps(OWN))
    forged["plugins"][0]["IPAM"] = {"Type": "evil-ipam"}
    why = cached_config_refusal(_attachment("cache", "netns"), json.dumps(forged).encode(), None, _trust())
    assert why is not None and "evil-ipam" in why
    forged["plugins"][0]["IPAM"] = {"type": "host-local", "\u212aubeconfig": "relative/config"}
    why = cached_config_refusal(_attachment("cache", "netns"), json.dumps(forged).encode(), None, _trust())
    assert why is not None and "not what the conf dir's config says" in why
