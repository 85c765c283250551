"""The Prometheus alert rules: promtool's own checks and the project's rule unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "cni-reaper-rules.yaml"
PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")
def test_rules_pass_promtool_check_and_unit_tests() -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 9 rules found" in check.stdout, check.stdout + check.stderr
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", str(Path(__file__).with_name("prometheus") / "cni-reaper-rules.test.yaml")],
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
