"""DEL with no netns, as runtimes run it once the netns is gone, for a leftover in no namespace:
only when every plugin of its chain that keeps state frees by container ID on this node
(cilium-cni; calico, whose datastore is the cluster's, only for a sandbox the agent saw a runtime
of this node list and that is gone: NodeTrust.gone_here), and only with a config the node
vouches for (reaper.reap.requests.without_netns_request)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from reaper.kinds import cache
from reaper.kinds.netconf import parse_network_config
from reaper.model import Attachment, AttachmentKey, Identity, NetworkConfig, NsKey
from reaper.reap.requests import NOT_LISTED_HERE, del_request, waits_for_plugin
from reaper.reap.trust import NO_KERNEL_EVIDENCE, NodeTrust, node_trust
from tests.harness.configs import cache_doc

CID = "c" * 64
NET = "k8s-pod-network"
RESULT = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/cni-1"}],
          "ips": [{"address": "192.168.7.9/32", "interface": 0}]}  # fmt: skip
KUBECONFIG = {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"}
CALICO = {"cniVersion": "1.0.0", "name": NET, "plugins": [
    {"type": "calico", "ipam": {"type": "calico-ipam"}, "kubernetes": KUBECONFIG},
    {"type": "portmap", "capabilities": {"portMappings": True}},
]}  # fmt: skip
CILIUM = {"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "cilium-cni", "kubernetes": KUBECONFIG}]}
KINDNET = {"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "ptp"}, {"type": "kindnet"}]}


def _own(config: dict[str, Any]) -> NetworkConfig:
    return parse_network_config(json.dumps(config).encode(), f"/etc/cni/net.d/10-{NET}.conflist")


POD_ARGS = [["K8S_POD_NAMESPACE", "default"], ["K8S_POD_NAME", "gone"]]
GONE_HERE = {CID: ("default", "gone")}  # CID's sandbox, as a runtime of this node listed it to the agent


def _entry(
    tmp: Path, config: dict[str, Any], result: dict[str, Any] = RESULT, cni_args: list[list[str]] | None = None
) -> dict[Identity, Any]:
    """A cache entry of CID, alone, read from its file as a look reads it."""
    results = tmp / "cache" / "results"
    results.mkdir(parents=True)
    args = cni_args if cni_args is not None else [["K8S_POD_NAME", "gone"]]
    doc = cache_doc(CID, NET, config=config, result=result, cniArgs=args)
    (results / f"{NET}-{CID}-eth0").write_text(json.dumps(doc))
    (entry,) = cache.collect_cache(str(tmp / "cache"), {NET}).entries
    return {cache.identity(entry): entry}


def _attachment(records: dict[Identity, Any]) -> Attachment:
    (entry,) = records.values()
    return Attachment(
        key=AttachmentKey(CID, NET, "eth0"),
        resources=(replace(cache.ref(entry), identity=cache.identity(entry)),),
        netns=None,
        verdict="orphan",
        reason="",
        age_seconds=0.0,
    )


def _trust(
    config: dict[str, Any], held_ips: tuple[str, ...] = (), gone_here: dict[str, tuple[str, str]] | None = None
) -> NodeTrust:
    return node_trust([_own(config)], (), held_ips, set(), gone_here=gone_here)


def test_a_cilium_leftover_gets_del_with_no_netns_and_its_cached_result(tmp_path: Path) -> None:
    records = _entry(tmp_path, CILIUM)
    attachment = _attachment(records)
    assert waits_for_plugin(attachment, records, [_own(CILIUM)], _trust(CILIUM)) is None
    request, note = del_request(attachment, records, [_own(CILIUM)], _trust(CILIUM))
    assert note is None and request is not None
    assert request.netns == "" and request.without_netns
    assert request.prev_result == RESULT and json.loads(request.config) == CILIUM
    assert request.source.endswith(f"{NET}-{CID}-eth0")
    assert ("K8S_POD_NAME", "gone") in request.cni_args


def test_a_calico_leftover_waits_its_datastore_is_the_clusters(tmp_path: Path) -> None:
    """Calico releases by container ID in the cluster's datastore: an ID no runtime of this node
    was seen to list may be a live pod's on another node, so no DEL runs for an entry with no
    pin (a forged one naming such an ID, or any in a one-shot run, which has seen nothing)."""
    records = _entry(tmp_path, CALICO, cni_args=POD_ARGS)
    attachment = _attachment(records)
    assert del_request(attachment, records, [_own(CALICO)], _trust(CALICO)) == (None, NOT_LISTED_HERE)
    why = waits_for_plugin(attachment, records, [_own(CALICO)], _trust(CALICO))
    assert why is not None and "calico" in why and "listed to this agent" in why


def test_a_calico_leftover_of_a_sandbox_listed_here_and_gone_gets_its_del_with_no_netns(tmp_path: Path) -> None:
    """Before: it waited for good. A sandbox a runtime of this node listed to this agent, and
    that every runtime now answers without, is this node's dead sandbox: its DEL frees its handle."""
    records = _entry(tmp_path, CALICO, cni_args=POD_ARGS)
    attachment = _attachment(records)
    trust = _trust(CALICO, gone_here=GONE_HERE)
    assert waits_for_plugin(attachment, records, [_own(CALICO)], trust) is None
    request, note = del_request(attachment, records, [_own(CALICO)], trust)
    assert note is None and request is not None
    assert request.netns == "" and request.without_netns and request.container_id == CID
    assert request.prev_result == RESULT and json.loads(request.config) == CALICO
    # The proof is of this container ID alone.
    other = _trust(CALICO, gone_here={"d" * 64: ("default", "gone")})
    assert del_request(attachment, records, [_own(CALICO)], other) == (None, NOT_LISTED_HERE)


def test_a_calico_entry_naming_another_pod_than_its_runtime_listed_waits(tmp_path: Path) -> None:
    """calico-ipam's DEL also releases the Calico 2.x handle `<namespace>.<pod>` of the pod
    CNI_ARGS name: the entry must name the pod its runtime listed, under every spelling."""
    trust = _trust(CALICO, gone_here=GONE_HERE)
    for n, args in enumerate(
        (
            [["K8S_POD_NAMESPACE", "default"], ["K8S_POD_NAME", "web-1"]],
            [["K8S_POD_NAME", "gone"]],  # no namespace: not the pod its runtime listed
            [*POD_ARGS, ["k8s_pod_name", "web-1"]],
            [*POD_ARGS, ["K8S_POD_NAMESPACE", "kube-system"]],  # the last pair wins in Go's LoadArgs
        )
    ):
        records = _entry(tmp_path / str(n), CALICO, cni_args=args)
        attachment = _attachment(records)
        assert del_request(attachment, records, [_own(CALICO)], trust) == (None, NOT_LISTED_HERE), args
        assert waits_for_plugin(attachment, records, [_own(CALICO)], trust) is not None


def test_a_proven_calico_leftover_still_waits_beside_a_plugin_not_on_either_list(tmp_path: Path) -> None:
    mixed = {**CALICO, "plugins": [*CALICO["plugins"], {"type": "kindnet"}]}
    records = _entry(tmp_path, mixed, cni_args=POD_ARGS)
    attachment = _attachment(records)
    trust = _trust(mixed, gone_here=GONE_HERE)
    assert del_request(attachment, records, [_own(mixed)], trust) == (None, NO_KERNEL_EVIDENCE)
    why = waits_for_plugin(attachment, records, [_own(mixed)], trust)
    assert why is not None and "kindnet" in why and why.endswith("no DEL runs without a netns pin")


def test_a_chain_with_any_other_stateful_plugin_waits_and_runs_nothing(tmp_path: Path) -> None:
    """kindnet answers a DEL with no netns with success, having freed nothing."""
    mixed = {**CALICO, "plugins": [*CALICO["plugins"], {"type": "kindnet"}]}
    for n, config in enumerate((KINDNET, mixed)):
        records = _entry(tmp_path / str(n), config)
        attachment = _attachment(records)
        assert del_request(attachment, records, [_own(config)], _trust(config)) == (None, NO_KERNEL_EVIDENCE)
        why = waits_for_plugin(attachment, records, [_own(config)], _trust(config))
        assert why is not None and "kindnet" in why and why.endswith("no DEL runs without a netns pin")


def test_a_config_the_node_does_not_vouch_for_runs_nothing_not_even_the_conf_dirs(tmp_path: Path) -> None:
    steered = json.loads(json.dumps(CILIUM))
    steered["plugins"][0]["kubernetes"]["kubeconfig"] = "/var/lib/cni/evil"
    records = _entry(tmp_path, steered)
    attachment = _attachment(records)
    request, note = del_request(attachment, records, [_own(CILIUM)], _trust(CILIUM))
    assert request is None and note is not None and "kubeconfig" in note
    why = waits_for_plugin(attachment, records, [_own(CILIUM)], _trust(CILIUM))
    assert why is not None and "kubeconfig" in why
    # A node whose conf dir runs no cilium-cni vouches for none.
    records = _entry(tmp_path / "other", CILIUM)
    request, note = del_request(_attachment(records), records, [_own(KINDNET)], _trust(KINDNET))
    assert request is None and note is not None and "no config in the conf dir uses: cilium-cni" in note


def test_a_prev_result_naming_an_address_in_use_runs_nothing(tmp_path: Path) -> None:
    records = _entry(tmp_path, CILIUM)
    trust = _trust(CILIUM, held_ips=("192.168.7.9",))
    request, note = del_request(_attachment(records), records, [_own(CILIUM)], trust)
    assert request is None and note is not None and "an attachment in use holds" in note


def test_in_a_namespace_or_with_no_plugin_allowed_to_run_it_gets_no_such_del(tmp_path: Path) -> None:
    records = _entry(tmp_path, CILIUM)
    attachment = _attachment(records)
    # --method kernel: no plugin runs, so the leftover waits (and takes no place under --max-reap).
    why = waits_for_plugin(attachment, records, [_own(CILIUM)], None)
    assert why is not None and why.endswith("no plugin runs (--method kernel)")
    # A namespace someone still holds (no pin): no DEL without the netns a runtime would pass.
    held = replace(attachment, netns=NsKey(4, 77))
    request, _ = del_request(held, records, [_own(CILIUM)], _trust(CILIUM))
    assert request is None
