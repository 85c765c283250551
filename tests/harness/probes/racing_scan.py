"""Run one scan pass whose runtime answers only after a new sandbox's netns appeared.

Usage: racing_scan.py WORKDIR. Prints the report as JSON. Run it inside a scratch netns.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from reaper.model import RuntimeView
from reaper.report import report_json
from reaper.scan import scan_pass
from tests.harness.scratch import scratch_settings
from tests.harness.static_liveness import StaticLiveness


class RacingRuntime:
    """Lists no sandbox, but a pod's netns is pinned while the list is being made."""

    def __init__(self, pin: Path) -> None:
        self.pin = pin
        self.inner = StaticLiveness(
            RuntimeView(
                endpoint="unix:///race.sock", name="race", version="1", reachable=True, error=None, sandboxes=()
            )
        )

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        self.pin.touch()
        subprocess.run(["unshare", f"--net={self.pin}", "true"], check=True)
        return self.inner.observe(known_netns)


def main(workdir: Path) -> None:
    settings = scratch_settings(workdir)
    pin = workdir / "netns" / "cni-0d1e2f3a-1111-2222-3333-444455556666"
    result = scan_pass(settings, RacingRuntime(pin), logging.getLogger("race"))
    json.dump(report_json(result.report), sys.stdout)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
