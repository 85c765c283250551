"""A sandbox's loopback cache entry, byte for byte as containerd's libcni writes it.

containerd gives every sandbox the network go-cni's `WithLoNetwork` loads (containerd/go-cni
opts.go: network `cni-loopback`, one plugin `loopback`, cniVersion 0.3.1, ifname `lo`); CRI-O's
ocicni did the same. The loopback plugin's result (containernetworking/plugins
plugins/main/loopback/loopback.go) is `lo` in the sandbox with its first IPv4 and IPv6
addresses, which it refuses unless they are loopback ones. libcni caches it as its cachedInfo
struct, `json.Marshal`ed: fields in struct order, the result as a map (keys sorted), the
config as base64.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

LOOPBACK_NETWORK = "cni-loopback"
# go-cni's WithLoNetwork config, byte for byte.
LOOPBACK_CONFLIST = b'{\n"cniVersion": "0.3.1",\n"name": "cni-loopback",\n"plugins": [{\n  "type": "loopback"\n}]\n}'


def go_json(value: object) -> bytes:
    """As Go's json.Marshal writes a map: compact, keys sorted."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def cri_args(container_id: str, pod: str) -> list[list[str]]:
    """The CNI_ARGS containerd's CRI passes, as libcni caches them."""
    return [
        ["IgnoreUnknown", "1"],
        ["K8S_POD_NAMESPACE", "default"],
        ["K8S_POD_NAME", pod],
        ["K8S_POD_INFRA_CONTAINER_ID", container_id],
        ["K8S_POD_UID", str(uuid.UUID(int=int(container_id[:32], 16)))],
    ]


def cached_info(
    container_id: str, network: str, ifname: str, config: bytes, netns: str, result: dict[str, Any]
) -> bytes:
    """libcni's cachedInfo as it writes it (kind, containerId, config, ifName, networkName,
    netns, cniArgs, result)."""
    head = {
        "kind": "cniCacheV1",
        "containerId": container_id,
        "config": base64.b64encode(config).decode(),
        "ifName": ifname,
        "networkName": network,
        "netns": netns,
        "cniArgs": cri_args(container_id, f"pod-{container_id[:10]}"),
    }
    return json.dumps(head, separators=(",", ":"))[:-1].encode() + b',"result":' + go_json(result) + b"}"


def loopback_result(netns: str) -> dict[str, Any]:
    """The loopback plugin's ADD result in the list's version, 0.3.1."""
    return {
        "cniVersion": "0.3.1",
        "dns": {},
        "interfaces": [{"mac": "00:00:00:00:00:00", "name": "lo", "sandbox": netns}],
        "ips": [
            {"address": "127.0.0.1/8", "interface": 0, "version": "4"},
            {"address": "::1/128", "interface": 0, "version": "6"},
        ],
    }


def loopback_entry(container_id: str, netns: str) -> bytes:
    """A sandbox's `cni-loopback-<id>-lo` cache entry."""
    return cached_info(container_id, LOOPBACK_NETWORK, "lo", LOOPBACK_CONFLIST, netns, loopback_result(netns))
