"""Benchmark of the scan pass: 250 live pods on a real containerd and 500 / 1,000 / 2,000 leaked
attachments, against the floor (the commands and reads any scan must pay).

Run as root: `make bench` (or `.venv/bin/python -m bench.scan_bench`). Prints a table.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.build_leaks import make_attachments
from tests.lab import Lab
from tests.reaper_cli import lab_flags

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
    return doc


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
        print(f"{'leaked':>7} {'attach':>7} {'floor s':>8} {'cold s':>7} {'warm s':>7} {'ratio':>6} "
              f"{'RSS MiB':>8} {'imports s':>9}  summary")  # fmt: skip
        for made, doc in rows:
            warm = statistics.median(doc["pass_s"][1:])
            floor = doc["floor_s"]["total"]
            attachments = sum(doc["summary"].values())
            print(
                f"{made:>7} {attachments:>7} {floor:>8.3f} {doc['pass_s'][0]:>7.3f} {warm:>7.3f} "
                f"{warm / floor:>6.2f} {doc['peak_rss_mib']:>8.1f} {doc['reaper_import_s']:>9.3f}  {doc['summary']}"
            )
        print()
        last = rows[-1][1]
        print("floor parts at the largest size:", {k: round(v, 3) for k, v in last["floor_s"].items()})
        print(
            "where a warm pass goes at the largest size:",
            {k: round(v, 3) for k, v in last["last_pass_parts_s"].items()},
        )
        print("cold = first pass (no state file yet); warm = median of the later passes; floor = median;")
        print("ratio = warm / floor; RSS = peak of the measuring process; imports = reaper's, apart from the pass")


if __name__ == "__main__":
    main()
