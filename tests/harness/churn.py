"""Pods created and removed over CRI while leaks are injected at random and the agent reaps.

Used by tests/test_churn.py (a short run) and bench/churn_bench.py (a long one). Between every
two actions every live pod is checked: its netns pin, host veth, lease (still naming it), cache
entry and ipMasq chain must all be there, and no two live pods may share an IP.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.lab import Lab, Leak
from tests.harness.lab.cni import masq_chain
from tests.harness.podman import NETWORK, LabPodman
from tests.harness.reaper_cli import lab_flags


@dataclass(frozen=True)
class LivePod:
    sandbox_id: str
    ip: str
    pin: Path
    veth: str
    lease: Path
    cache: Path
    chain: str


@dataclass
class ChurnFigures:
    seconds: float = 0.0
    pods_created: int = 0
    pods_removed: int = 0
    creations_failed: int = 0
    leaks_injected: int = 0
    leaks_reclaimed: int = 0
    checks: int = 0
    passes: int = 0
    podman_started: int = 0
    podman_removed: int = 0
    live_harmed: int = 0
    duplicate_ips: int = 0
    harm: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"churn for {self.seconds:.0f}s, agent passes: {self.passes}, checks of every live pod: {self.checks}",
            f"pods created: {self.pods_created} (failed: {self.creations_failed}), removed: {self.pods_removed}",
            f"leaks injected: {self.leaks_injected}, reclaimed: {self.leaks_reclaimed}",
            f"podman containers started: {self.podman_started}, removed: {self.podman_removed}",
            f"live resources harmed: {self.live_harmed} (must be 0), duplicate IPs: {self.duplicate_ips} (must be 0)",
        ]


def _record(lab: Lab, sandbox_id: str) -> LivePod | str:
    pin = lab.pod_netns_path(sandbox_id)
    if pin is None:
        return f"{sandbox_id[:12]}: no netns right after RunPodSandbox"
    ip = lab.pod_ip(sandbox_id)
    veth = lab.host_veth_of(pin)
    if veth is None:
        return f"{sandbox_id[:12]}: no host veth right after RunPodSandbox"
    net = lab.network_name
    return LivePod(
        sandbox_id,
        ip,
        pin,
        veth,
        lab.ipam_dir / net / ip,
        lab.cache_dir / "results" / f"{net}-{sandbox_id}-eth0",
        masq_chain(net, sandbox_id),
    )


def _harm(lab: Lab, pods: dict[str, LivePod]) -> list[str]:
    links = {link["ifname"] for link in json.loads(lab.run_in_netns(["ip", "-j", "link", "show"], check=True).stdout)}
    chains = lab.run_in_netns(["iptables-save", "-t", "nat"], check=True).stdout
    harm = []
    for pod in pods.values():
        sid = pod.sandbox_id[:12]
        if not pod.pin.exists():
            harm.append(f"{sid}: netns pin gone")
        if pod.veth not in links:
            harm.append(f"{sid}: veth {pod.veth} gone")
        if not _names(pod.lease, pod.sandbox_id):
            harm.append(f"{sid}: lease {pod.ip} gone or names another container")
        if not pod.cache.exists():
            harm.append(f"{sid}: cache entry gone")
        if f":{pod.chain} " not in chains:
            harm.append(f"{sid}: chain {pod.chain} gone")
    return harm


def _podman_record(lab: Lab, podman: LabPodman, name: str) -> LivePod:
    """A running podman container, as the files podman wrote for it name it."""
    cid = podman.run(name)
    cache = lab.cache_dir / "results" / f"{NETWORK}-{cid}-eth0"
    interfaces = json.loads(cache.read_bytes())["result"]["interfaces"]
    pin = lab.netns_dir / Path(next(i["sandbox"] for i in interfaces if i.get("sandbox"))).name
    veth = next(i["name"] for i in interfaces if not i.get("sandbox") and i["name"] != podman.bridge)
    ip = podman.ip(cid)
    return LivePod(cid, ip, pin, veth, lab.ipam_dir / NETWORK / ip, cache, masq_chain(NETWORK, cid))


def _names(lease: Path, container_id: str) -> bool:
    """The lease file exists and still names `container_id` (its IP may have gone to a new pod)."""
    try:
        return lease.read_bytes().split(b"\r\n")[0].decode() == container_id
    except (FileNotFoundError, UnicodeDecodeError):
        return False


def _leak_gone(lab: Lab, leak: Leak, links: set[str]) -> bool:
    return not (
        leak.netns_path.exists()
        or _names(leak.lease_path, leak.container_id)
        or (leak.cache_path is not None and leak.cache_path.exists())
        or leak.host_veth in links
    )


def _passes(log_path: Path) -> int:
    """Passes the agent has logged so far."""
    return sum(1 for line in log_path.read_text().splitlines() if '"msg": "pass"' in line)


def _churning(elapsed: float, seconds: float, passes: int, min_passes: int) -> bool:
    return elapsed < seconds or (passes < min_passes and elapsed < 3 * seconds)


def run_churn(
    lab: Lab,
    seconds: float,
    seed: int,
    workdir: Path,
    interval: str = "1s",
    min_age: str = "3s",
    decoy: Lab | None = None,
    podman: LabPodman | None = None,
    min_passes: int = 10,
) -> ChurnFigures:
    """Churn for `seconds`, and on (up to three times as long) until the agent has made
    `min_passes` passes: a loaded machine slows the passes, not what each one must get right.

    `min_age` must stay above the runtime's RunPodSandbox time: containerd
    lists a sandbox only once its network is set up and its pause process runs, so a pass that
    looks in between sees a pin, a veth and a lease that nothing lists yet (measured: at --min-age 0
    the agent then breaks pods being created).

    With `decoy`, a second runtime that lists no pods is asked too (first); with `podman`, podman
    containers come and go beside the pods, are checked like them, and the agent sees the node as
    podman does."""
    rng = random.Random(seed)
    figures = ChurnFigures()
    log_path = workdir / "agent.log"
    view = podman.node_view() if podman is not None else []
    argv = ["nsenter", f"--net={lab.netns_path}", *view, sys.executable, "-m", "reaper", "run", "--mode", "reap"]
    if decoy is not None:
        argv += ["--runtime-endpoint", decoy.endpoint]
    argv += [*lab_flags(lab, workdir / "state.json"), "--interval", interval, "--log-format", "json"]
    argv += ["--min-age", min_age, "--confirmations", "1", "--max-orphan-ratio", "1"]
    if podman is not None:
        argv += ["--netns-dir", "/run/netns"]
    pods: dict[str, LivePod] = {}
    boxes: dict[str, LivePod] = {}  # podman containers, by name
    leaks: list[Leak] = []
    started = time.monotonic()
    with open(log_path, "wb") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            n = 0
            while _churning(time.monotonic() - started, seconds, _passes(log_path), min_passes):
                n += 1
                action = rng.choices(["create", "remove", "leak", "podman"], weights=[4, 3, 2, 2 if podman else 0])[0]
                if action == "podman" and podman is not None:
                    if boxes and rng.random() < 0.4:
                        name = rng.choice(sorted(boxes))
                        del boxes[name]
                        podman.podman("rm", "-f", "-t", "0", name)
                        figures.podman_removed += 1
                    else:
                        boxes[f"box-{n}"] = _podman_record(lab, podman, f"box-{n}")
                        figures.podman_started += 1
                elif action == "create" or (action == "remove" and not pods):
                    attempt = lab.try_run_pod(f"churn-{n}")
                    if attempt.ok and attempt.sandbox_id is not None:
                        record = _record(lab, attempt.sandbox_id)
                        figures.pods_created += 1
                        if isinstance(record, str):
                            figures.live_harmed += 1
                            figures.harm.append(record)
                        else:
                            pods[attempt.sandbox_id] = record
                    else:
                        figures.creations_failed += 1
                        figures.harm.append(f"RunPodSandbox failed: {attempt.error}")
                elif action == "remove":
                    victim = rng.choice(sorted(pods))
                    del pods[victim]  # no longer live from here on
                    lab.stop_pod(victim)
                    lab.remove_pod(victim)
                    figures.pods_removed += 1
                else:
                    leaks.append(lab.make_leak(with_cache=rng.random() < 0.5))
                    figures.leaks_injected += 1
                harm = _harm(lab, {**pods, **{b.sandbox_id: b for b in boxes.values()}})
                figures.checks += 1
                figures.live_harmed += len(harm)
                figures.harm.extend(harm)
                ips = [p.ip for p in pods.values()] + [b.ip for b in boxes.values()]
                figures.duplicate_ips += len(ips) - len(set(ips))
            # Injection over: every leak must be gone within a few passes.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                links = {
                    link["ifname"]
                    for link in json.loads(lab.run_in_netns(["ip", "-j", "link", "show"], check=True).stdout)
                }
                figures.leaks_reclaimed = sum(1 for leak in leaks if _leak_gone(lab, leak, links))
                if figures.leaks_reclaimed == len(leaks):
                    break
                time.sleep(0.5)
            harm = _harm(lab, {**pods, **{b.sandbox_id: b for b in boxes.values()}})
            figures.live_harmed += len(harm)
            figures.harm.extend(harm)
        finally:
            agent.terminate()
            agent.wait(30)
    figures.seconds = time.monotonic() - started
    figures.passes = _passes(log_path)
    for sandbox_id in list(pods):
        lab.stop_pod(sandbox_id)
        lab.remove_pod(sandbox_id)
    if podman is not None:
        for name in list(boxes):
            podman.podman("rm", "-f", "-t", "0", name)
    return figures
