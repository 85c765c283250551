"""The agent's pass from two or more checkouts of the reaper, in turns on one lab (an A/B).

Builds 250 live pods on a real containerd, then at each count of `--leaks` leaked attachments
(default 0, then 2,000) runs `bench.scan_child` (this checkout's: the same floor for every
tree) with each given tree's `reaper` package, `--rounds` times in turns, and prints each
tree's agent pass, floor and ratio, round by round and as medians, then each tree's marginal
cost of the leaks over the floor's (issue 33's ratio). Set SCAN_CHILD_ROUNDS (default 9) for
fewer rounds inside each run. A tree is a directory holding a `reaper` package, as `git archive <rev> reaper |
tar -x -C DIR` leaves it; `.` is this checkout.

With `--hold`, the lab stays up after the rounds until SIGTERM or SIGINT, and the flags to reach it are
printed (for a profiler: `nsenter --net=<lab netns> python -m bench.scan_child <flags>`).

Run as root: `.venv/bin/python -m bench.scan_ab --rounds 4 /tmp/base .`
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.build_leaks import make_attachments, run_live_pods
from bench.scan_bench import LIVE
from tests.harness.lab import Lab
from tests.harness.reaper_cli import lab_flags

ROOT = Path(__file__).resolve().parent.parent


def run_child(lab: Lab, tree: Path, state: Path) -> dict[str, Any]:
    """One `bench.scan_child` run with `tree`'s reaper package (first on the path)."""
    env = {**os.environ, "PYTHONPATH": f"{tree}:{ROOT}"}
    argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "bench.scan_child"]
    argv += [*lab_flags(lab, state), "--min-age", "0", "--confirmations", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900, env=env, cwd=tree)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--leaks", default="0,2000", help="leak counts, in turn, comma-separated (default 0,2000)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    trees: list[Path] = [t.resolve() for t in args.trees]
    steps = [int(n) for n in args.leaks.split(",")]
    for tree in trees:
        compileall.compile_dir(str(tree / "reaper"), quiet=1)
    with Lab(subnet="10.201.0.0/18", cri_timeout=120) as lab, tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        run_live_pods(lab, LIVE)
        made = 0
        medians: Medians = {}
        for step in steps:
            if step > made:
                make_attachments(lab, step - made, first_host=LIVE + 10 + made)
                made = step
            medians.update(_rounds(lab, trees, tmp, made, args.rounds))
        if len(steps) > 1:
            first, last = steps[0], steps[-1]
            print(f"\nthe agent's marginal cost of {last - first} leaks over the floor's (medians):")
            for tree in trees:
                (agent0, floor0), (agent1, floor1) = medians[(tree, first)], medians[(tree, last)]
                print(f"  {tree!s:<40} agent +{agent1 - agent0:.3f}s  floor +{floor1 - floor0:.3f}s  "
                      f"= {(agent1 - agent0) / (floor1 - floor0):.2f}x")  # fmt: skip
        if args.hold:
            signal.signal(signal.SIGTERM, _interrupted)  # a background job ignores SIGINT
            print(f"holding the lab until SIGTERM or SIGINT (pid {os.getpid()}); the flags:", flush=True)
            print(f"  nsenter --net={lab.netns_path}", " ".join(lab_flags(lab, tmp / "held-state.json")), flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


Medians = dict[tuple[Path, int], tuple[float, float]]  # (tree, leaks): (agent s, floor s)


def _rounds(lab: Lab, trees: list[Path], tmp: Path, made: int, rounds: int) -> Medians:
    """Each tree's pass `rounds` times in turns at `made` leaks: (agent, floor) medians."""
    results: dict[Path, list[dict[str, Any]]] = {tree: [] for tree in trees}
    for n in range(rounds):
        for i, tree in enumerate(trees):
            doc = run_child(lab, tree, tmp / f"state-{made}-{n}-{i}.json")
            results[tree].append(doc)
            floor, agent = doc["floor_s"]["best"], doc["agent_s"]
            print(f"{made:>5} leaks, round {n}  {tree!s:<40} agent {agent:.3f}  floor {floor:.3f}  "
                  f"ratio {agent / floor:.2f}", flush=True)  # fmt: skip
    out = {}
    for tree, docs in results.items():
        agent = statistics.median(d["agent_s"] for d in docs)
        floor = statistics.median(d["floor_s"]["best"] for d in docs)
        parts = {k: round(statistics.median(d["agent_parts_s"][k] for d in docs), 3) for k in docs[0]["agent_parts_s"]}
        floor_parts = {k: round(statistics.median(d["floor_s"][k] for d in docs), 3) for k in docs[0]["floor_s"]}
        print(f"{made:>5} leaks  {tree!s:<40} median agent {agent:.3f}  floor {floor:.3f}  "
              f"ratio {agent / floor:.2f}")  # fmt: skip
        print(f"  agent parts {parts}")
        print(f"  floor parts {floor_parts}")
        out[(tree, made)] = (agent, floor)
    return out


if __name__ == "__main__":
    main()
