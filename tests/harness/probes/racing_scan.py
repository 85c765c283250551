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

from reaper.model import Policy, RuntimeView
from reaper.names import compile_netns_patterns
from reaper.report import report_json
from reaper.scan import scan_pass
from reaper.settings import Settings
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
    for sub in ("netns", "ipam", "cache", "conf", "bin"):
        (workdir / sub).mkdir(exist_ok=True)
    settings = Settings(
        netns_dirs=(str(workdir / "netns"),),
        netns_patterns=compile_netns_patterns(()),
        ipam_dirs=(str(workdir / "ipam"),),
        cni_cache_dir=str(workdir / "cache"),
        cni_conf_dir=str(workdir / "conf"),
        cni_bin_dirs=(str(workdir / "bin"),),
        runtime_endpoints=(),
        runtime_timeout=1.0,
        policy=Policy(min_age=0.0, confirmations=1, stuck_after=900.0),
        state_file=str(workdir / "state.json"),
        json_output=True,
        log_format="text",
        log_level="warning",
    )
    pin = workdir / "netns" / "cni-0d1e2f3a-1111-2222-3333-444455556666"
    result = scan_pass(settings, RacingRuntime(pin), logging.getLogger("race"))
    json.dump(report_json(result.report), sys.stdout)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
