"""Run a probe, a module of `tests.harness.probes`, as root in a network namespace of its own
(and a private mount namespace, unless told): the pins, veths and mounts it makes vanish with
it. Probes are modules, not source in strings, so ruff and mypy read them like any other code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def probe_argv(probe: ModuleType, *args: str, python: str = sys.executable) -> list[str]:
    """The command that runs `probe` with `args`, by `python -m` with the repo's root on its
    path: it imports `reaper` and `tests.harness` as the tests do, whatever its cwd (entering a
    mount namespace moves it to that namespace's root), behind nsenter, unshare or setpriv.
    `python`: another interpreter (a probe that imports the standard library alone)."""
    return ["env", f"PYTHONPATH={ROOT}", python, "-m", probe.__name__, *args]


def run_probe(probe: ModuleType, *args: str, private_mounts: bool = True, timeout: float = 120) -> Any:
    """What the probe printed as JSON; the test fails with its stderr when it fails."""
    mounts = ["--mount", "--propagation", "private"] if private_mounts else []
    argv = ["unshare", *mounts, "--net", *probe_argv(probe, *args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
