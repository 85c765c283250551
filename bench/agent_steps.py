"""Where the agent's pass grows with the leaks: each step's time at 0 and N leaks beside 250 pods.

    python -m bench.agent_steps [N]    (N: 2000 by default)

Builds a private lab (as bench.scan_bench does), then in its netns runs `scan_pass` as `reaper
run` does (an InventoryMemo and a KeptState kept across passes): two passes to fill them, then
PASSES passes, each step's least time kept. Prints the steps at 0 leaks, at N, and the growth.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.build_leaks import make_attachments, run_live_pods
from tests.harness.lab import Lab
from tests.harness.reaper_cli import lab_flags

LIVE_PODS = 250
PASSES = 7

CHILD = """
import json, logging, sys
from reaper.cli import build_parser
from reaper.host.memo import InventoryMemo
from reaper.runtime.cri import CriLiveness
from reaper.scan import scan_pass
from reaper.settings import settings_from
from reaper.state import KeptState
settings = settings_from(build_parser().parse_args(["scan", *json.loads(sys.argv[1])]), {})
log = logging.getLogger("agent_steps")
log.setLevel(logging.ERROR)
liveness = CriLiveness(settings.runtime_endpoints, settings.runtime_timeout)
memo, kept = InventoryMemo(), KeptState()
for _ in range(2):
    scan_pass(settings, liveness, log, memo=memo, kept=kept)
least: dict[str, float] = {}
for _ in range(int(sys.argv[2])):
    for step, seconds in scan_pass(settings, liveness, log, memo=memo, kept=kept).timings:
        least[step] = min(least.get(step, seconds), seconds)
print(json.dumps(least))
"""


def steps(lab: Lab, state: Path) -> dict[str, float]:
    flags = [*lab_flags(lab, state), "--min-age", "0", "--confirmations", "1"]
    argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-c", CHILD, json.dumps(flags), str(PASSES)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    least: dict[str, float] = json.loads(out.splitlines()[-1])
    return least


def main(argv: list[str]) -> int:
    leaks = int(argv[0]) if argv else 2000
    with Lab(subnet="10.202.0.0/17", cri_timeout=120) as lab, tempfile.TemporaryDirectory() as tmp:
        run_live_pods(lab, LIVE_PODS)
        before = steps(lab, Path(tmp) / "0.json")
        make_attachments(lab, leaks, first_host=LIVE_PODS + 50)
        after = steps(lab, Path(tmp) / f"{leaks}.json")
    print(f"{'step':<12} {'0 s':>8} {leaks:>7} s {'growth':>8}")
    for step in sorted(after, key=lambda s: after[s] - before.get(s, 0.0), reverse=True):
        print(f"{step:<12} {before.get(step, 0.0):8.4f} {after[step]:9.4f} {after[step] - before.get(step, 0.0):+8.4f}")
    print(f"{'total':<12} {sum(before.values()):8.3f} {sum(after.values()):9.3f} "
          f"{sum(after.values()) - sum(before.values()):+8.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
