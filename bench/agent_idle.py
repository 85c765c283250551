"""The agent between passes: resident memory and CPU, on a lab with live pods and some leaks;
then how long a SIGTERM between passes takes to stop it.

Run as root: `make bench-agent` (or `.venv/bin/python -m bench.agent_idle`). Prints figures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.harness.lab import Lab
from tests.harness.reaper_cli import lab_flags

PODS = 30
LEAKS = 10
INTERVAL = 30.0
TICKS = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def main() -> None:
    with Lab() as lab, tempfile.TemporaryDirectory() as tmp:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda i: lab.run_pod(f"live-{i}"), range(PODS)))
        for _ in range(LEAKS):
            lab.make_leak(with_cache=True)
        log = Path(tmp) / "agent.log"
        argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", "run", "--mode", "reap"]
        argv += [*lab_flags(lab, Path(tmp) / "state.json"), "--interval", f"{INTERVAL:g}s", "--log-format", "json"]
        argv += ["--min-age", "0", "--confirmations", "1", "--max-orphan-ratio", "1"]
        with open(log, "wb") as out:
            agent = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 60
                while log.read_text().count('"msg": "pass"') < 1 and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(2)  # the pass's last log line is written; now idle until the next
                rss_after_pass = rss_mib(agent.pid)
                cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
                time.sleep(20)
                idle_cpu = (cpu_seconds(agent.pid) - cpu0) / (time.monotonic() - t0)
                rss_idle = rss_mib(agent.pid)
                passes = log.read_text().count('"msg": "pass"')
                reclaimed = log.read_text().count('"msg": "reclaimed"')
            finally:
                asked_to_stop = time.monotonic()
                agent.send_signal(signal.SIGTERM)
                code = agent.wait(30)
                stop_seconds = time.monotonic() - asked_to_stop
        print(f"lab: {PODS} live pods, {LEAKS} leaks; agent interval {INTERVAL:g}s, reap mode")
        print(f"passes so far: {passes}; attachments reclaimed: {reclaimed}")
        print(f"RSS right after a pass: {rss_after_pass:.1f} MiB; after 20 s idle: {rss_idle:.1f} MiB")
        print(f"CPU while idle: {idle_cpu * 100:.2f}% of one core; exit status on SIGTERM: {code}")
        print(f"stopped {stop_seconds:.2f}s after SIGTERM (between passes)")


if __name__ == "__main__":
    main()
