"""Make many attachments fast, the way the bridge, host-local and ipMasq plugins leave them.

Running the real plugins 2,000 times takes minutes; the benchmark only needs the same kernel
objects and files: a pinned netns, a veth pair into it on the lab bridge, a host-local lease,
a libcni cache entry and an ipMasq chain with its POSTROUTING jump, all named as the plugins
name them.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import secrets
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reaper.kinds.iptables import chain_name
from tests.harness.lab import Lab


@dataclass(frozen=True)
class FakeAttachment:
    container_id: str
    ip: str
    pin: Path
    veth: str


def _checked(proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args[2:4]} failed: {proc.stderr.strip()[:2000]}")


def _pin(path: Path) -> None:
    path.touch()
    subprocess.run(["unshare", f"--net={path}", "true"], check=True)


def run_live_pods(lab: Lab, count: int, namespace: str = "bench") -> None:
    """`count` live pods (live-0, live-1, ...) on the lab's containerd, four started at once."""
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: lab.run_pod(f"live-{i}", namespace=namespace), range(count)))
    print(f"built {count} live pods in {time.perf_counter() - t:.1f}s", flush=True)


def make_attachments(lab: Lab, count: int, first_host: int) -> list[FakeAttachment]:
    net = ipaddress.ip_network(lab.subnet)
    out = []
    for i in range(count):
        cid = secrets.token_hex(32)
        out.append(
            FakeAttachment(
                container_id=cid,
                ip=str(net.network_address + first_host + i),
                pin=lab.netns_dir / f"cni-{uuid.uuid4()}",
                veth=f"veth{secrets.token_hex(4)}",
            )
        )
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(_pin, [a.pin for a in out]))
    # A bridge takes at most 1,024 ports, so the leaks get bridges of their own, 1,000 each.
    batch = []
    for index in sorted({(first_host + i) // 1000 for i in range(count)}):
        bridge = f"{lab.bridge}b{index}"
        if lab.run_in_netns(["ip", "link", "show", bridge]).returncode != 0:
            batch += [f"link add {bridge} type bridge", f"link set {bridge} up"]
    for i, a in enumerate(out):
        bridge = f"{lab.bridge}b{(first_host + i) // 1000}"
        batch.append(f"link add {a.veth} type veth peer name eth0 netns {a.pin}")
        batch.append(f"link set {a.veth} master {bridge} up")
    _checked(lab.run_in_netns(["ip", "-batch", "-"], input="\n".join(batch) + "\n", timeout=600))

    conflist = lab.network_spec.conflist_bytes("normal")
    encoded = base64.b64encode(conflist).decode()
    lease_dir = lab.ipam_dir / lab.network_name
    lease_dir.mkdir(parents=True, exist_ok=True)
    results = lab.cache_dir / "results"
    results.mkdir(parents=True, exist_ok=True, mode=0o700)
    prefix = net.prefixlen
    rules = ["*nat"]
    for a in out:
        (lease_dir / a.ip).write_bytes(f"{a.container_id}\r\neth0".encode())
        entry = {
            "kind": "cniCacheV1",
            "containerId": a.container_id,
            "config": encoded,
            "ifName": "eth0",
            "networkName": lab.network_name,
            "cniArgs": [
                ["IgnoreUnknown", "1"],
                ["K8S_POD_NAMESPACE", "bench"],
                ["K8S_POD_NAME", f"p-{a.container_id[:8]}"],
            ],
            "result": {
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": lab.bridge},
                    {"name": a.veth},
                    {"name": "eth0", "sandbox": str(a.pin)},
                ],
                "ips": [{"interface": 2, "address": f"{a.ip}/{prefix}", "gateway": str(net.network_address + 1)}],
            },
        }
        path = results / f"{lab.network_name}-{a.container_id}-eth0"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        chain = chain_name("", lab.network_name, a.container_id)
        comment = f'"name: \\"{lab.network_name}\\" id: \\"{a.container_id}\\""'
        rules.append(f":{chain} - [0:0]")
        rules.append(f"-A {chain} -d {net} -m comment --comment {comment} -j ACCEPT")
        rules.append(f"-A {chain} ! -d 224.0.0.0/4 -m comment --comment {comment} -j MASQUERADE")
        rules.append(f"-A POSTROUTING -s {a.ip}/32 -m comment --comment {comment} -j {chain}")
    rules.append("COMMIT")
    _checked(lab.run_in_netns(["iptables-restore", "--noflush"], input="\n".join(rules) + "\n", timeout=600))
    return out
