"""Benchmark of the scan pass: 250 live pods on a real containerd and 500 / 1,000 / 2,000 leaked
attachments, against the floor (the commands and reads any scan must pay).

Run as root: `make bench` (or `.venv/bin/python -m bench.scan_bench`). Prints a table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.build_leaks import make_attachments
from tests.harness.lab import Lab
from tests.harness.reaper_cli import lab_flags

LIVE = 250
LEAK_STEPS = (500, 1000, 2000)


def measure(lab: Lab, state: Path) -> dict[str, Any]:
    t = time.perf_counter()
    proc = subprocess.run(
        [
            "nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "bench.scan_child",
            *lab_flags(lab, state), "--min-age", "0", "--confirmations", "1",
        ],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    wall = time.perf_counter() - t
    doc: dict[str, Any] = json.loads(proc.stdout)
    doc["process_wall_s"] = wall
    doc["cli_rss_mib"], doc["cli_wall_s"] = one_shot_cli(lab, state)
    return doc


def one_shot_cli(lab: Lab, state: Path) -> tuple[float, float]:
    """Peak RSS and wall time of `reaper scan --json` as a timer would run it."""
    argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", "scan", "--json"]
    argv += [*lab_flags(lab, state), "--min-age", "0", "--confirmations", "1"]
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped by wait4
    return usage.ru_maxrss / 1024, time.perf_counter() - t


def main() -> None:
    with Lab(subnet="10.201.0.0/20", cri_timeout=120) as lab, tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda i: lab.run_pod(f"live-{i}", namespace="bench"), range(LIVE)))
        print(f"built {LIVE} live pods on containerd in {time.perf_counter() - t:.1f}s", flush=True)
        made = 0
        rows = []
        for target in LEAK_STEPS:
            t = time.perf_counter()
            make_attachments(lab, target - made, first_host=LIVE + 10 + made)
            made = target
            print(f"built leaks up to {made} in {time.perf_counter() - t:.1f}s", flush=True)
            state = Path(tmp) / f"state-{made}.json"
            doc = measure(lab, state)
            rows.append((made, doc))
        print()
        print(f"{'leaked':>7} {'attach':>7} {'floor s':>8} {'first s':>8} {'pass s':>7} {'ratio':>6} "
              f"{'agent s':>8} {'ratio':>6} {'RSS MiB':>8} {'CLI MiB':>8} {'CLI s':>6} {'imports s':>9}")  # fmt: skip
        for made, doc in rows:
            one_shot = statistics.median(doc["pass_s"][1:])
            agent = statistics.median(doc["memo_pass_s"][1:])
            floor = doc["floor_s"]["total"]
            attachments = sum(doc["summary"].values())
            print(
                f"{made:>7} {attachments:>7} {floor:>8.3f} {doc['pass_s'][0]:>8.3f} {one_shot:>7.3f} "
                f"{one_shot / floor:>6.2f} {agent:>8.3f} {agent / floor:>6.2f} {doc['peak_rss_mib']:>8.1f} "
                f"{doc['cli_rss_mib']:>8.1f} {doc['cli_wall_s']:>6.2f} {doc['reaper_import_s']:>9.3f}"
            )
        print()
        last = rows[-1][1]
        print("floor parts at the largest size:", {k: round(v, 3) for k, v in last["floor_s"].items()})
        print(
            "where a warm pass goes at the largest size:",
            {k: round(v, 3) for k, v in last["last_pass_parts_s"].items()},
        )
        print("floor = median of ip -j -d link show + iptables-save -t nat + reading every file the scan reads")
        print("first = the first pass (no state file); pass = median of later passes reading every file (one-shot)")
        print("agent = median of passes that keep an InventoryMemo (files unchanged since the last pass not re-read)")
        print("RSS = peak of the measuring process (18 passes, a memo); CLI = one `reaper scan --json` process,")
        print("its peak RSS and wall time including interpreter start-up; imports = reaper's, apart from the passes")
        print("verdicts at the largest size:", last["summary"])


if __name__ == "__main__":
    main()
