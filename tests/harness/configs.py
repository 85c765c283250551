"""Network configs as the tests write them."""

from __future__ import annotations

import json


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
