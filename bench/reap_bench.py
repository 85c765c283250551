"""Benchmark of reclaiming leaked attachments beside 250 live pods on a real containerd.

Rounds, each on fresh leaks (netns, veth, lease, cache entry, ipMasq chain), interleaved:
  kernel N:   `reaper reap --method kernel` (no plugin runs), at N = 500, 2,000 and 5,000;
  floor N:    the least any tool must do for the same leaks: the scan's reads (the link dump,
              `iptables-save -t nat`, every lease, cache file and pin), unmount and unlink every pin (bare
              syscalls, no checks), wait for the kernel to drop the veths, unlink every lease
              and cache file, one iptables-restore deleting every chain and its jump;
  del 2000:   `reaper reap` (the plugins' DEL, then the kernel for what is left);
  delfloor:   the same plugin chain's DEL run directly for each leak (the lab's own libcni-like
              runner: each plugin of the conflist in reverse, the cached result as prevResult),
              as many at once as the reaper runs, then each pin unmounted and its cache entry
              removed, as a runtime does after DEL; after the same scan reads.

Also `kernel 0`: the same one-shot with nothing leaked, the pass's fixed cost (the interpreter,
the scan of the live pods), so that each round's marginal milliseconds an attachment are
(wall - wall at 0) / N: flat when the cost is linear.

Run as root: `make bench-reap` (or `.venv/bin/python -m bench.reap_bench [N ...]`). Prints a
table: seconds, milliseconds an attachment, marginal milliseconds an attachment, and the ratios
against the floors of the same run.
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

from bench.build_leaks import FakeAttachment, make_attachments, run_live_pods
from reaper.kinds.iptables import chain_name
from reaper.settings import DEL_CONCURRENCY
from tests.harness.lab import Lab
from tests.harness.lab.cni import PluginCall, del_network_list
from tests.harness.reaper_cli import lab_flags

LIVE = 250
SIZES = (500, 2000, 5000)
CLONE_NEWNET = 0x40000000
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
    skipped = [f"{s['container_id'][:12]}: {s['reason']}" for s in doc.get("skipped", [])]
    return {
        "wall": wall,
        "cpu": cpu,
        "timings": doc["timings"],
        "methods": methods,
        "count": len(doc["reclaimed"]),
        "skipped": skipped,
    }


def scan_floor(lab: Lab) -> float:
    """What any tool must read to find the leaks: the link dump and the nat table (C tools, in
    the lab's netns), every lease and cache file, the pins."""
    t = time.perf_counter()
    for argv in (["ip", "-j", "-d", "link", "show"], ["iptables-save", "-t", "nat"]):
        if lab.run_in_netns(argv, timeout=600).returncode != 0:
            raise RuntimeError(f"floor {argv[0]} failed")
    for root in (lab.ipam_dir, lab.cache_dir):
        for dirpath, _, files in os.walk(root):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as f:
                    f.read()
    for entry in os.scandir(lab.netns_dir):
        entry.stat(follow_symlinks=False)
    return time.perf_counter() - t


def floor(lab: Lab, leaks: list[FakeAttachment]) -> dict[str, float]:
    out = {"scan": scan_floor(lab)}
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


def del_floor(lab: Lab, leaks: list[FakeAttachment]) -> dict[str, float]:
    """Each leak's chain DEL run directly, as many at once as `reaper reap` runs by default
    (--del-concurrency), from threads in the lab's netns (setns is per thread; the plugins they
    start inherit it), then the pins and cache entries."""
    conflist = json.loads(lab.network_spec.conflist_bytes("normal"))
    results = lab.cache_dir / "results"
    netns_fd = os.open(lab.netns_path, os.O_RDONLY)

    def enter() -> None:
        if _libc.setns(netns_fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the lab netns")

    def one(leak: FakeAttachment) -> None:
        entry = json.loads((results / f"{lab.network_name}-{leak.container_id}-eth0").read_bytes())
        call = PluginCall(
            command="DEL",
            container_id=leak.container_id,
            netns=str(leak.pin),
            ifname="eth0",
            cni_args=tuple((k, v) for k, v in entry["cniArgs"]),
            bin_dir=lab.bin_dir,
            exec_netns=None,
        )
        del_network_list(conflist, call, {}, entry["result"])

    out = {"scan": scan_floor(lab)}
    try:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=DEL_CONCURRENCY, initializer=enter) as pool:
            list(pool.map(one, leaks))
        out["chain_del"] = time.perf_counter() - t
    finally:
        os.close(netns_fd)
    t = time.perf_counter()
    for leak in leaks:
        os.unlink(results / f"{lab.network_name}-{leak.container_id}-eth0")
        _libc.umount2(os.fsencode(str(leak.pin)), 2)
        os.unlink(leak.pin)
    out["unpin_files"] = time.perf_counter() - t
    out["total"] = sum(out.values())
    return out


def main() -> None:
    sizes = tuple(int(arg) for arg in sys.argv[1:]) or SIZES
    del_leaks = sizes[len(sizes) // 2]  # the DEL rounds at the middle size: 2,000 by default
    need = LIVE + 10 + 2 * sum(sizes) + 2 * del_leaks
    with Lab(subnet="10.202.0.0/17", cri_timeout=120) as lab, tempfile.TemporaryDirectory() as tmp:
        assert need < 32_000, "the leaks must fit the lab's /17"
        run_live_pods(lab, LIVE)
        first = LIVE + 10
        rows: list[tuple[str, int, float, str]] = []
        walls: dict[str, float] = {}
        plan = (
            [("kernel", 0)]
            + [(name, n) for n in sizes for name in ("kernel", "floor")]
            + [
                ("del", del_leaks),
                ("delfloor", del_leaks),
            ]
        )
        for name, n in plan:
            t = time.perf_counter()
            leaks = make_attachments(lab, n, first_host=first)
            first += n
            print(f"built {n} leaks in {time.perf_counter() - t:.1f}s for the {name} round", flush=True)
            if name == "floor":
                found = floor(lab, leaks)
                wall, parts = found["total"], ", ".join(f"{k} {v:.2f}" for k, v in found.items() if k != "total")
            elif name == "delfloor":
                found = del_floor(lab, leaks)
                wall, parts = found["total"], ", ".join(f"{k} {v:.2f}" for k, v in found.items() if k != "total")
            else:
                extra = ("--method", "kernel") if name == "kernel" else ()
                got = reap(lab, Path(tmp) / f"state-{name}-{n}.json", *extra)
                if got["count"] != n:
                    # Reported, not fatal: a leak of an earlier round is found in the next one.
                    print(f"  NOTE {name} {n}: reclaimed {got['count']}; skipped: {got['skipped'][:5]}", flush=True)
                wall = got["wall"]
                parts = ", ".join(f"{k} {v:.2f}" for k, v in got["timings"].items())
                parts += f"; {got['cpu']:.1f} CPU-s; by method {got['methods']}"
            walls[f"{name} {n}"] = wall
            rows.append((name, n, wall, parts))
            print(f"  {name} {n}: {wall:.2f} s ({parts})", flush=True)
        print()
        print(f"{'round':<9} {'attach':>6} {'wall s':>8} {'ms/att':>7} {'marginal':>8}  of which")
        fixed = walls["kernel 0"]
        for name, n, wall, parts in rows:
            per = f"{1000 * wall / n:>7.2f}" if n else f"{'-':>7}"
            marginal = f"{1000 * (wall - fixed) / n:>8.2f}" if n and name == "kernel" else f"{'-':>8}"
            print(f"{name:<9} {n:>6} {wall:>8.2f} {per} {marginal}  {parts}")
        print()
        for n in sizes:
            ratio = walls[f"kernel {n}"] / walls[f"floor {n}"]
            print(f"kernel / floor at {n}: {ratio:.2f}  (target at 2,000: at most 3)")
        ratio = walls[f"del {del_leaks}"] / walls[f"delfloor {del_leaks}"]
        print(f"del / plugin-chain floor at {del_leaks}: {ratio:.2f}  (target: at most 1.5)")


if __name__ == "__main__":
    main()
