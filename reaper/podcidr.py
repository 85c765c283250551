"""The node's pod CIDRs, for host-local ranges whose subnet is `usePodCidr` / `usePodCidrIPv6`.

Calico (and Canal) fill those in from the Node's `spec.podCIDRs` before calling host-local, so
they come from `--pod-cidr` or, in a pod, from the API server. Only the range gauges use them: a
wrong or missing pod CIDR never changes what is reclaimed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from msgspec import Struct

from reaper.kubeapi import API_TIMEOUT, KubeApiError, ServiceAccount, in_cluster, is_node_name, service_account

MAX_NODE_BYTES = 8 << 20  # a Node with its image list is tens of KB; more is not a Node


class PodCidrError(Exception):
    """The pod CIDRs could not be learnt; the message is one line for the operator."""


class PodCidrs(Struct, frozen=True):
    """At most one pod CIDR per family, and where they came from."""

    v4: str | None
    v6: str | None
    source: str

    def of_version(self, version: int) -> str | None:
        return self.v4 if version == 4 else self.v6


def pod_cidrs_from(values: Iterable[str], source: str) -> PodCidrs:
    """The first IPv4 and the first IPv6 network of `values` (as Calico takes them from
    `spec.podCIDRs`); PodCidrError for a value that is not a network."""
    first: dict[int, str] = {}  # by IP version
    for value in values:
        try:
            net = ipaddress.ip_network(value, strict=True)
        except (ValueError, TypeError):
            raise PodCidrError(f"{str(value)[:80]!r} from {source} is not a network in CIDR notation") from None
        first.setdefault(net.version, str(net))
    return PodCidrs(first.get(4), first.get(6), source)


def node_pod_cidrs(doc: object, node_name: str) -> PodCidrs:
    """The pod CIDRs of a Node object as the API server returns it."""
    # lightkube sets `kind` from the type it decodes into: the name asked for is what tells a
    # Node from another object, so both are checked.
    metadata = doc.get("metadata") if isinstance(doc, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(doc, dict) or doc.get("kind") != "Node" or name != node_name:
        raise PodCidrError(f"the API server's answer for node {node_name} is not a Node")
    spec = doc["spec"] if isinstance(doc.get("spec"), dict) else {}
    values = spec.get("podCIDRs")
    if not isinstance(values, list):
        single = spec.get("podCIDR")
        values = [single] if isinstance(single, str) else []
    if not all(isinstance(v, str) for v in values) or len(values) > 2:
        raise PodCidrError(f"node {node_name}'s spec.podCIDRs is not a list of at most two networks")
    if not values:
        raise PodCidrError(f"node {node_name} has no spec.podCIDR (the controller manager allocates none)")
    return pod_cidrs_from(values, f"node {node_name}'s spec.podCIDRs")


def from_api(node_name: str, env: Mapping[str, str], timeout: float = API_TIMEOUT) -> PodCidrs:
    """GET /api/v1/nodes/NAME with the pod's service account (reaper.kubeapi), verified against its
    CA, the answer decoded as lightkube's core/v1 Node."""
    if not is_node_name(node_name):
        raise PodCidrError(f"{node_name[:80]!r} is not a node name")
    try:
        sa = service_account(env)
    except KubeApiError as err:
        raise PodCidrError(str(err)) from None
    # Imported here: only an agent in a pod asks the API, and the client costs every other start.
    from lightkube.resources.core_v1 import Node  # noqa: PLC0415

    from reaper.kubeclient import API_FAILURES, api_client, describe, status_of  # noqa: PLC0415

    try:
        with api_client(sa, timeout=timeout, max_answer=MAX_NODE_BYTES) as client:
            node = client.get(Node, node_name)
    except API_FAILURES as err:
        status = status_of(err)
        if status is None and not isinstance(err, ValueError) and "answer larger" not in str(err):
            raise PodCidrError(describe(err, sa.where)) from None
        raise PodCidrError(f"GET node {node_name}: {_answer_problem(err, status, sa)}") from None
    return node_pod_cidrs(node.to_dict(), node_name)


def _answer_problem(err: BaseException, status: int | None, sa: ServiceAccount) -> str:
    """The one line for a failed GET of the Node."""
    import msgspec  # noqa: PLC0415

    from reaper.kubeclient import describe  # noqa: PLC0415

    why = {401: "the token was refused", 403: "the service account may not get nodes"}.get(status or 0)
    if why:
        return f"HTTP {status} ({why})"
    if isinstance(err, msgspec.ValidationError):  # JSON, not of a Node's shape
        return f"the answer is not a Node ({err})"
    return describe(err, sa.where)


def resolve_pod_cidrs(given: Iterable[str], node_name: str | None, env: Mapping[str, str]) -> PodCidrs | None:
    """The pod CIDRs from `--pod-cidr`, else from the API server when in a pod and the node's
    name is known, else None (ranges with the placeholders are then reported unknown)."""
    if values := list(given):
        return pod_cidrs_from(values, "--pod-cidr")
    if node_name and in_cluster(env):
        return from_api(node_name, env)
    return None
