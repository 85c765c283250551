"""Whole scan passes over one old lease with no owner (confirmations 3) while the state file's
count for it is forged to a million between passes: by one-shots (the file their only memory)
and by an agent's KeptState. Usage: forged_counts WORKDIR; run in a scratch netns. Prints each
verdict and reason, as JSON."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from reaper.model import RuntimeView
from reaper.scan import scan_pass
from reaper.state import KeptState
from tests.harness.scratch import scratch_settings
from tests.harness.static_liveness import StaticLiveness

A = "a" * 64
KEY = f"{A}/mynet/eth0"


def main(work: Path) -> None:
    for sub in ("netns", "ipam/mynet", "cache", "conf", "bin"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    lease = work / "ipam/mynet/10.88.0.5"
    lease.write_bytes(f"{A}\r\neth0".encode())
    os.utime(lease, (1_000_000, 1_000_000))  # old: min-age is met
    state = work / "state.json"
    settings = scratch_settings(work, confirmations=3)
    runtime = StaticLiveness(
        RuntimeView(endpoint="unix:///x.sock", name="x", version="1", reachable=True, error=None, sandboxes=())
    )
    log = logging.getLogger("probe")

    def forge() -> None:
        # Whoever writes the state dir says the lease has had no owner for a million passes.
        doc = json.loads(state.read_bytes())
        doc["attachments"][KEY] = [1.0, 10**6, 0]  # last counted: never, so this pass counts
        state.write_text(json.dumps(doc))

    def verdict(kept: KeptState | None = None) -> list[str]:
        (a,) = scan_pass(settings, runtime, log, kept=kept).report.attachments
        return [a.verdict, a.reason]

    out: dict[str, object] = {}
    out["fresh"] = verdict()
    forge()
    out["one_shot_after_forgery"] = verdict()
    out["saved_count"] = json.loads(state.read_bytes())["attachments"][KEY][1]
    state.unlink()
    kept = KeptState()
    out["agent_first"] = verdict(kept)
    forge()
    out["agent_second"] = verdict(kept)
    forge()
    out["agent_third"] = verdict(kept)
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
