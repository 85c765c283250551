"""The node's pod CIDRs, for host-local ranges whose subnet is `usePodCidr` / `usePodCidrIPv6`.

Calico's CNI plugin (and Canal's) fills those placeholders in from the Kubernetes Node object
(`spec.podCIDRs`, or the older `spec.podCIDR`) before it calls host-local; nothing on the node
holds the value. So it comes from `--pod-cidr`, or, in a pod, from the API server with the pod's
service account (the chart grants `get` on nodes). Only the range gauges use it: a wrong or
missing pod CIDR never changes what is reclaimed.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping

from msgspec import Struct

from reaper.host.confined import UnfitFile, read_admins
from reaper.host.jsondoc import parse_json

SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_TIMEOUT = 5.0
MAX_NODE_BYTES = 8 << 20  # a Node with its image list is tens of KB; more is not a Node
MAX_SECRET_BYTES = 1 << 20
# RFC 6750's b64token: what a service-account token (a JWT) is made of
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
# RFC 1123 subdomain, as Kubernetes names nodes
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


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
    v4: str | None = None
    v6: str | None = None
    for value in values:
        try:
            net = ipaddress.ip_network(value, strict=True)
        except (ValueError, TypeError):
            raise PodCidrError(f"{str(value)[:80]!r} from {source} is not a network in CIDR notation") from None
        if net.version == 4 and v4 is None:
            v4 = str(net)
        elif net.version == 6 and v6 is None:
            v6 = str(net)
    return PodCidrs(v4, v6, source)


def node_pod_cidrs(doc: object, node_name: str) -> PodCidrs:
    """The pod CIDRs of a Node object as the API server returns it."""
    if not isinstance(doc, dict) or doc.get("kind") != "Node":
        raise PodCidrError(f"the API server's answer for node {node_name} is not a Node")
    spec = doc.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    values = spec.get("podCIDRs")
    if not isinstance(values, list):
        single = spec.get("podCIDR")
        values = [single] if isinstance(single, str) else []
    if not all(isinstance(v, str) for v in values) or len(values) > 2:
        raise PodCidrError(f"node {node_name}'s spec.podCIDRs is not a list of at most two networks")
    if not values:
        raise PodCidrError(f"node {node_name} has no spec.podCIDR (the controller manager allocates none)")
    return pod_cidrs_from(values, f"node {node_name}'s spec.podCIDRs")


def _read_secret(directory: str, name: str) -> bytes:
    path = os.path.join(directory, name)
    try:
        return read_admins(path, MAX_SECRET_BYTES)
    except OSError as err:
        raise PodCidrError(f"cannot read {path}: {err.strerror or err}") from None
    except UnfitFile as err:
        raise PodCidrError(f"cannot read {path}: {err}") from None


def in_cluster(env: Mapping[str, str]) -> bool:
    """Running in a pod that may ask the API server (the variables every pod gets)."""
    return bool(env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"))


def from_api(node_name: str, env: Mapping[str, str], timeout: float = API_TIMEOUT) -> PodCidrs:
    """GET /api/v1/nodes/NAME with the pod's service account token, verified against its CA."""
    # Imported here: only an agent in a pod asks the API, and ssl costs every other start.
    import http.client  # noqa: PLC0415
    import ssl  # noqa: PLC0415

    if not _NODE_NAME.fullmatch(node_name) or len(node_name) > 253:
        raise PodCidrError(f"{node_name[:80]!r} is not a node name")
    sa_dir = env.get("REAPER_SERVICEACCOUNT_DIR") or SERVICEACCOUNT_DIR
    token = _read_secret(sa_dir, "token").decode("ascii", "replace").strip()
    if not _BEARER_TOKEN.fullmatch(token):  # nothing else goes into a header
        raise PodCidrError(f"{sa_dir}/token is not a bearer token")
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cadata=_read_secret(sa_dir, "ca.crt").decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as err:  # ValueError: no certificate in it at all
        raise PodCidrError(f"{sa_dir}/ca.crt is not a CA certificate: {getattr(err, 'reason', None) or err}") from None
    host, port = env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
    if not port.isdigit():
        raise PodCidrError(f"KUBERNETES_SERVICE_PORT {port[:20]!r} is not a port")
    conn = http.client.HTTPSConnection(host, int(port), timeout=timeout, context=context)
    try:
        conn.request(
            "GET",
            f"/api/v1/nodes/{node_name}",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
        response = conn.getresponse()
        body = response.read(MAX_NODE_BYTES + 1)
    except (OSError, http.client.HTTPException) as err:  # TLS failures included
        raise PodCidrError(f"the API server at {host}:{port} did not answer: {err}") from None
    finally:
        conn.close()
    if response.status != 200:
        reason = {401: "the token was refused", 403: "the service account may not get nodes"}.get(
            response.status, response.reason
        )
        raise PodCidrError(f"GET node {node_name}: HTTP {response.status} ({reason})")
    if len(body) > MAX_NODE_BYTES:
        raise PodCidrError(f"GET node {node_name}: answer larger than {MAX_NODE_BYTES >> 20} MiB")
    try:
        doc = parse_json(body)
    except ValueError as err:
        raise PodCidrError(f"GET node {node_name}: answer is not JSON ({err})") from None
    return node_pod_cidrs(doc, node_name)


def resolve_pod_cidrs(given: Iterable[str], node_name: str | None, env: Mapping[str, str]) -> PodCidrs | None:
    """The pod CIDRs from `--pod-cidr`, else from the API server when in a pod and the node's
    name is known, else None (ranges with the placeholders are then reported unknown)."""
    values = list(given)
    if values:
        return pod_cidrs_from(values, "--pod-cidr")
    if node_name and in_cluster(env):
        return from_api(node_name, env)
    return None
