"""The real `reaper` command, run by hand as an operator would, beside a CRI runtime made to
order that lists no sandbox and one old host-local lease of a container it does not list.
Usage: report_only WORKDIR twice|mode; run in a scratch netns and mount namespace. `twice`: two
scans seconds apart and the count the state file keeps; `mode`: a reap where REAPER_MODE is
scan, refused, as a dry run, and forced. Prints what each run returned, as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.fake_cri import FakeRuntime, sandbox_list

A = "a" * 64
KEY = f"{A}/mynet/eth0"


def reaper(work: Path, command: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    flags = ["--netns-dir", str(work / "netns"), "--ipam-dir", str(work / "ipam")]
    flags += ["--cni-cache-dir", str(work / "cache"), "--cni-conf-dir", str(work / "conf")]
    flags += ["--cni-bin-dir", str(work / "bin"), "--runtime-endpoint", f"unix://{work}/cri.sock"]
    flags += ["--state-file", str(work / "state.json"), "--min-age", "0"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    run = subprocess.run(
        [sys.executable, "-m", "reaper", command, "--json", *flags, *extra],
        capture_output=True, text=True, timeout=60, env={**clean, **(env or {})}, check=False,
    )  # fmt: skip
    doc = json.loads(run.stdout) if run.stdout.startswith("{") else None
    attachments = (doc.get("attachments") or doc.get("report", {}).get("attachments", [])) if doc else []
    return {"status": run.returncode, "stderr": run.stderr, "verdicts": [a["verdict"] for a in attachments]}


def main(work: Path, case: str) -> None:
    for sub in ("netns", "ipam/mynet", "cache", "conf", "bin"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    lease = work / "ipam/mynet/10.88.0.5"
    lease.write_bytes(f"{A}\r\neth0".encode())
    os.utime(lease, (1_000_000, 1_000_000))  # old: min-age is met
    out: dict[str, Any] = {}
    with FakeRuntime(work / "cri.sock", sandbox_list([]), {}):
        if case == "twice":
            out["first"] = reaper(work, "scan", "--confirmations", "2")
            out["second"] = reaper(work, "scan", "--confirmations", "2")
            out["count"] = json.loads((work / "state.json").read_text())["attachments"][KEY][1]
        else:
            scan_pod = {"REAPER_MODE": "scan"}
            out["refused"] = reaper(work, "reap", "--confirmations", "1", env=scan_pod)
            out["lease_after_refusal"] = lease.exists()
            out["dry_run"] = reaper(work, "reap", "--confirmations", "1", "--dry-run", env=scan_pod)
            out["forced"] = reaper(work, "reap", "--confirmations", "1", "--force", env=scan_pod)
            out["lease_after_force"] = lease.exists()
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
