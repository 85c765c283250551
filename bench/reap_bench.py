"""Benchmark of reclaiming: 2,000 leaked attachments beside 250 live pods on a real containerd.

Three rounds, each on 2,000 fresh leaks (netns, veth, lease, cache entry, ipMasq chain):
  kernel: `reaper reap --method kernel` (no plugin runs);
  floor:  the least any tool must do for the same leaks: unmount and unlink every pin (bare
          syscalls, no checks), wait for the kernel to drop the veths, unlink every lease and
          cache file, one iptables-restore deleting every chain and its jump;
  del:    `reaper reap` (the plugins' DEL, two at a time, then the kernel for what is left).

Run as root: `make bench-reap` (or `.venv/bin/python -m bench.reap_bench`). Prints a table.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.build_leaks import FakeAttachment, make_attachments
from reaper.kinds.iptables import chain_name
from tests.harness.lab import Lab
from tests.harness.reaper_cli import lab_flags

LIVE = 250
LEAKS = 2000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def reap(lab: Lab, state: Path, *extra: str) -> dict[str, Any]:
    argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", "reap", "--json"]
    argv += [*lab_flags(lab, state), "--min-age", "0", "--confirmations", "1", "--force", "--max-reap", "100000"]
    argv += list(extra)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"reap exited {proc.returncode}: {proc.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    methods: dict[str, int] = {}
    for outcome in doc["reclaimed"]:
        for r in outcome["resources"]:
            assert r["ok"], r
            methods[r["method"]] = methods.get(r["method"], 0) + 1
    return {"wall": wall, "cpu": cpu, "timings": doc["timings"], "methods": methods, "count": len(doc["reclaimed"])}


def floor(lab: Lab, leaks: list[FakeAttachment]) -> dict[str, float]:
    out = {}
    t = time.perf_counter()
    for leak in leaks:
        _libc.umount2(os.fsencode(str(leak.pin)), 2)
        os.unlink(leak.pin)
    out["unpin"] = time.perf_counter() - t
    t = time.perf_counter()
    names = {leak.veth for leak in leaks}
    while names & {link["ifname"] for link in json.loads(lab.run_in_netns(["ip", "-j", "link", "show"]).stdout)}:
        time.sleep(0.05)
    out["veths_gone"] = time.perf_counter() - t
    t = time.perf_counter()
    for leak in leaks:
        os.unlink(lab.ipam_dir / lab.network_name / leak.ip)
        os.unlink(lab.cache_dir / "results" / f"{lab.network_name}-{leak.container_id}-eth0")
    out["files"] = time.perf_counter() - t
    t = time.perf_counter()
    lines = ["*nat"]
    for leak in leaks:
        chain = chain_name("", lab.network_name, leak.container_id)
        comment = f'"name: \\"{lab.network_name}\\" id: \\"{leak.container_id}\\""'
        lines.append(f"-D POSTROUTING -s {leak.ip}/32 -m comment --comment {comment} -j {chain}")
        lines += [f"-F {chain}", f"-X {chain}"]
    lines.append("COMMIT")
    proc = lab.run_in_netns(["iptables-restore", "--noflush"], input="\n".join(lines) + "\n", timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"floor iptables-restore failed: {proc.stderr[-500:]}")
    out["iptables_restore"] = time.perf_counter() - t
    out["total"] = sum(out.values())
    return out


def main() -> None:
    with Lab(subnet="10.202.0.0/18", cri_timeout=120) as lab, tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda i: lab.run_pod(f"live-{i}", namespace="bench"), range(LIVE)))
        print(f"built {LIVE} live pods in {time.perf_counter() - t:.1f}s", flush=True)
        first = LIVE + 10
        rounds: dict[str, Any] = {}
        for name in ("kernel", "floor", "del"):
            t = time.perf_counter()
            leaks = make_attachments(lab, LEAKS, first_host=first)
            first += LEAKS
            print(f"built {LEAKS} leaks in {time.perf_counter() - t:.1f}s for the {name} round", flush=True)
            if name == "floor":
                rounds[name] = floor(lab, leaks)
            else:
                extra = ("--method", "kernel") if name == "kernel" else ()
                rounds[name] = reap(lab, Path(tmp) / f"state-{name}.json", *extra)
            print(f"  {name}: {json.dumps(rounds[name])}", flush=True)
        kernel_round, floor_round, del_round = rounds["kernel"], rounds["floor"], rounds["del"]
        reclaim_s = kernel_round["timings"].get("kernel", 0.0)
        print()
        print(f"{'round':<8} {'attach':>6} {'wall s':>8} {'of which':<60}")
        parts = ", ".join(f"{k} {v:.2f}" for k, v in kernel_round["timings"].items())
        print(f"{'kernel':<8} {kernel_round['count']:>6} {kernel_round['wall']:>8.2f} {parts}")
        parts = ", ".join(f"{k} {v:.2f}" for k, v in floor_round.items() if k != "total")
        print(f"{'floor':<8} {LEAKS:>6} {floor_round['total']:>8.2f} {parts}")
        parts = ", ".join(f"{k} {v:.2f}" for k, v in del_round["timings"].items())
        print(f"{'del':<8} {del_round['count']:>6} {del_round['wall']:>8.2f} {parts}")
        print()
        whole = kernel_round["wall"] / floor_round["total"]
        print(f"kernel step alone / floor: {reclaim_s / floor_round['total']:.2f}  "
              f"(whole pass, with scan, re-check and two more looks: {whole:.2f})")  # fmt: skip
        cores = del_round["cpu"] / del_round["wall"]
        print(f"del round: {del_round['cpu']:.1f} CPU-s in {del_round['wall']:.1f} s wall = {cores:.2f} cores busy")
        print(f"resources by method, kernel round: {kernel_round['methods']}; del round: {del_round['methods']}")


if __name__ == "__main__":
    main()
