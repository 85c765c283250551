"""Run a Python probe as root in a network namespace of its own (and a private mount
namespace, unless told): the pins, veths and mounts it makes vanish with it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def run_probe(script: str, *args: str, private_mounts: bool = True, timeout: float = 120) -> Any:
    """What the probe printed as JSON; the test fails with its stderr when it fails."""
    mounts = ["--mount", "--propagation", "private"] if private_mounts else []
    argv = ["unshare", *mounts, "--net", sys.executable, "-c", script, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
