"""Network configs and cache entries as the tests write them."""

from __future__ import annotations

import base64
import json
from typing import Any


def conflist(name: str = "mynet", **ipam: object) -> bytes:
    ipam_block = {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]], **ipam}
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [
                {"type": "bridge", "ipam": ipam_block},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
    ).encode()


def cache_doc(container_id: str, network: str, ifname: str = "eth0", config: Any = None, **more: Any) -> dict[str, Any]:
    """A cniCacheV1 entry as libcni writes it; `config`, when given, is base64-encoded as libcni does."""
    doc: dict[str, Any] = {"kind": "cniCacheV1", "containerId": container_id, "networkName": network, "ifName": ifname}
    if config is not None:
        doc["config"] = base64.b64encode(json.dumps(config).encode()).decode()
    return {**doc, **more}
