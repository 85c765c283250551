"""The address check (tests.harness.probes.address_check) beside two namespaces of COUNT
addresses each, one uid 65534 made (the orphan's 10.9.0.5 among them) and one root made; then
beside the user's alone. Usage: address_check_memory FLOOD COUNT HEADROOM_MIB, FLOOD the
address_flood script. Run as root in a mount, network and PID namespace of its own (with its own
/proc). Prints each check's exit and what it left, as JSON."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from typing import Any

from tests.harness.probe import probe_argv
from tests.harness.probes import address_check

PROCS: list[subprocess.Popen[str]] = []


def kill_procs() -> None:
    for proc in PROCS:
        proc.kill()


def start(argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    PROCS.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", argv
    return proc


def check(count: str, headroom_mib: str) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}  # no 64 MiB arena reserved for the reader thread
    done = subprocess.run(
        probe_argv(address_check, count, headroom_mib), capture_output=True, text=True, env=env, timeout=600
    )
    if done.returncode != 0:
        return {"exit": done.returncode, "stderr": done.stderr.strip()[-400:]}
    return {"exit": 0, **json.loads(done.stdout)}


def main(flood: str, count: str, headroom_mib: str) -> None:
    atexit.register(kill_procs)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "unshare", "-Urn"]
    start([*nobody, "python3", flood, count, "10.9.0.0"])  # the orphan's 10.9.0.5 among them
    roots = start(["unshare", "-n", "python3", flood, count, "11.0.0.0"])
    both = check(count, headroom_mib)
    roots.kill()
    roots.wait()
    users_only = check(count, headroom_mib)
    print(json.dumps({"both": both, "users_only": users_only}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
