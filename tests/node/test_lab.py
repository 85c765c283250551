"""Smoke test of the lab harness: real containerd, real plugins, and a clean machine after."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from reaper.runtime.client import CriError, RuntimeClient
from tests.harness.cri import api_pb2 as pb
from tests.harness.lab import Lab, Leak, PortMap, is_nsfs, kernel, masq_chain

HOST_CNI_RESULTS = Path("/var/lib/cni/results")


@dataclass(frozen=True)
class MachineState:
    """What a lab may touch on the host, to compare before and after."""

    mounts: frozenset[tuple[str, str]]
    netns: frozenset[str]
    lab_dirs: frozenset[str]
    paths: frozenset[str]
    runtime_pids: frozenset[int]


def _runtime_pids() -> frozenset[int]:
    names = {"containerd", "containerd-shim", "containerd-shim-runc-v2", "pause"}
    found: set[int] = set()
    for pid in kernel.pids():
        cmd = kernel.read_cmdline(pid)
        if cmd and kernel.alive(pid) and os.path.basename(cmd[0]) in names:
            found.add(pid)
    return frozenset(found)


def _snapshot() -> MachineState:
    run_netns = Path("/run/netns")
    watched = [
        "/run/netns",
        "/run/containerd",
        "/run/mount",
        "/run/xtables.lock",
        "/var/lib/cni",
        "/var/lib/containerd",
        "/opt/containerd",
    ]
    return MachineState(
        mounts=frozenset((m.mount_point, m.root) for m in kernel.mountinfo()),
        netns=frozenset(p.name for p in run_netns.iterdir()) if run_netns.is_dir() else frozenset(),
        lab_dirs=frozenset(p.name for p in Path("/tmp").glob("reaperlab-*")),
        paths=frozenset(p for p in watched if os.path.lexists(p)),
        runtime_pids=_runtime_pids(),
    )


def _nat(lab: Lab) -> str:
    return lab.run_in_netns(["iptables-save", "-t", "nat"], check=True).stdout


def _lease_for(lab: Lab, container_id: str) -> Path | None:
    for lease in (lab.ipam_dir / lab.network_name).iterdir():
        if lease.name[0].isdigit() and lease.read_text().split()[0] == container_id:
            return lease
    return None


def _state(lab: Lab, sandbox_id: str) -> int:
    return next(s.state for s in lab.sandboxes() if s.id == sandbox_id)


def _check_leak(lab: Lab, leak: Leak, nat: str) -> None:
    assert is_nsfs(leak.netns_path) and leak.netns_path.parent == lab.netns_dir
    assert leak.lease_path.read_bytes() == f"{leak.container_id}\r\n{leak.ifname}".encode()
    link = lab.run_in_netns(["ip", "-j", "link", "show", "dev", leak.host_veth])
    assert link.returncode == 0, link.stderr
    assert not Path("/sys/class/net", leak.host_veth).exists()  # not in the host netns
    assert lab.host_veth_of(leak.netns_path) == leak.host_veth
    assert f":{leak.masq_chain} - " in nat
    assert f'id: \\"{leak.container_id}\\"' in nat
    assert leak.container_id not in {s.id for s in lab.sandboxes()}


def test_lab_smoke() -> None:
    before = _snapshot()
    lab = Lab()
    with lab:
        root, netns_name = lab.root, lab.netns_name
        subnet = ipaddress.ip_network(lab.subnet)
        assert lab.containerd_pid is not None
        assert kernel.read_cmdline(lab.containerd_pid)[0] == "containerd"  # its own pid, not a wrapper's
        assert lab.netns_dir.is_relative_to(root) and lab.cache_dir.is_relative_to(root)

        # Two pods over CRI, one with a hostPort.
        web = lab.run_pod("web", port_mappings=[PortMap(host_port=8080, container_port=80)])
        plain = lab.run_pod("plain")
        for sid in (web, plain):
            pin = lab.pod_netns_path(sid)
            assert pin is not None and pin.parent == lab.netns_dir
            assert is_nsfs(pin), f"{pin} did not propagate to the host as a netns pin"
            ip = lab.pod_ip(sid)
            assert ipaddress.ip_address(ip) in subnet
            ping = lab.run_in_netns(["ping", "-c1", "-W2", ip])
            assert ping.returncode == 0, ping.stdout + ping.stderr
            cache = lab.cache_dir / "results" / f"{lab.network_name}-{sid}-eth0"
            entry = json.loads(cache.read_text())
            assert entry["kind"] == "cniCacheV1" and entry["containerId"] == sid
            assert stat.S_IMODE(cache.stat().st_mode) == 0o600
            assert not (HOST_CNI_RESULTS / cache.name).exists()
            assert _state(lab, sid) == pb.SANDBOX_READY
        nat = _nat(lab)
        assert f":{masq_chain(lab.network_name, web)} - " in nat
        assert f'dnat name: \\"{lab.network_name}\\" id: \\"{web}\\"' in nat
        assert not Path("/sys/class/net", lab.bridge).exists()  # the bridge is in the lab netns

        # Leaks made with the real plugins, for IDs the runtime never saw.
        cached = lab.make_leak(with_cache=True, port_mappings=[PortMap(9090, 90)])
        bare = lab.make_leak(with_cache=False)
        nat = _nat(lab)
        for leak in (cached, bare):
            _check_leak(lab, leak, nat)
        assert cached.cache_path is not None
        entry = json.loads(cached.cache_path.read_text())
        assert entry["containerId"] == cached.container_id and entry["result"] == cached.result
        assert entry["capabilityArgs"]["portMappings"][0]["HostPort"] == 9090
        assert f'dnat name: \\"{lab.network_name}\\" id: \\"{cached.container_id}\\"' in nat
        assert bare.cache_path is None
        assert not any(bare.container_id in p.name for p in (lab.cache_dir / "results").iterdir())

        # Seed report 1: no CNI config -> NOTREADY sandbox still holding its netns pin.
        lab.set_network("empty")
        empty = lab.try_run_pod("seed-empty")
        assert empty.error is not None and "cni plugin not initialized" in empty.error
        assert empty.sandbox_id is not None
        assert _state(lab, empty.sandbox_id) == pb.SANDBOX_NOTREADY
        empty_pin = lab.pod_netns_path(empty.sandbox_id)
        assert empty_pin is not None and empty_pin.parent == lab.netns_dir and is_nsfs(empty_pin)
        with pytest.raises(CriError, match="cni plugin not initialized"):
            lab.stop_pod(empty.sandbox_id)

        # Seed report 2: a later plugin fails ADD -> pin, veth, lease and chain, no cache entry.
        lab.set_network("failing")
        failing = lab.try_run_pod("seed-failing")
        assert failing.error is not None and "reaper-fail" in failing.error
        failing_id = failing.sandbox_id
        assert failing_id is not None and _state(lab, failing_id) == pb.SANDBOX_NOTREADY
        failing_pin = lab.pod_netns_path(failing_id)
        assert failing_pin is not None and is_nsfs(failing_pin)
        assert lab.host_veth_of(failing_pin) is not None
        assert _lease_for(lab, failing_id) is not None
        assert f":{masq_chain(lab.network_name, failing_id)} - " in _nat(lab)
        assert not any(failing_id in p.name for p in (lab.cache_dir / "results").iterdir())
        with pytest.raises(CriError, match="reaper-fail"):
            lab.stop_pod(failing_id)

        # containerd, a shim per running pod, and the two pause processes.
        lab_pids = lab.processes()
        assert lab.containerd_pid in lab_pids
        pause = [p for p in lab_pids if kernel.read_cmdline(p) == ["/pause"]]
        assert len(pause) == 2
        assert len(lab_pids) >= 5

        # Runtime stopped -> unreachable, pods keep running; started again -> same sandboxes.
        listed = {s.id for s in lab.sandboxes()}
        lab.stop_runtime()
        assert lab.containerd_pid is None
        with pytest.raises(CriError, match="UNAVAILABLE"), RuntimeClient(lab.endpoint, timeout=2.0) as client:
            client.version()
        assert all(kernel.alive(p) for p in pause)
        lab.start_runtime()
        assert {s.id for s in lab.sandboxes()} == listed
        lab_pids |= lab.processes()

    # The machine is as before.
    assert not root.exists()
    assert not Path("/run/netns", netns_name).exists()
    assert not [m for m in kernel.mountinfo() if str(root) in m.mount_point or str(root) in m.root]
    assert not [p for p in lab_pids if kernel.alive(p)]
    assert not [
        pid
        for pid in kernel.pids()
        if any(str(root) in arg for arg in kernel.read_cmdline(pid) + kernel.read_environ(pid))
    ]
    for cgroup in kernel.mountinfo():
        if cgroup.fstype in ("cgroup", "cgroup2"):
            assert not Path(cgroup.mount_point, lab.cgroup_parent.strip("/")).exists()
    assert _snapshot() == before
    lab.close()  # idempotent
