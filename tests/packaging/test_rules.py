"""The Prometheus alert rules: promtool's own checks and the project's rule unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "cni-reaper-rules.yaml"
PROMTOOL = shutil.which("promtool")
# Every file of rule unit tests: cni-reaper-rules.test.yaml, and one per alert added since.
RULE_TESTS = sorted((Path(__file__).with_name("prometheus")).glob("*.test.yaml"))


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")
def test_rules_pass_promtool_check_and_unit_tests() -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 10 rules found" in check.stdout, check.stdout + check.stderr
    tested = subprocess.run([PROMTOOL, "test", "rules", *map(str, RULE_TESTS)], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = [yaml.safe_load(path.read_text()) for path in RULE_TESTS]
    cases = [case for doc in tests for test in doc["tests"] for case in test.get("alert_rule_test", [])]
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert "CniReaperOldOrphans" in alerts
    assert alerts <= fired, f"never seen firing: {sorted(alerts - fired)}"
    # PassesStalled's quiet case is a node beside the one it fires for (n5), not an empty case.
    assert alerts - {"CniReaperPassesStalled"} <= quiet, f"never seen quiet: {sorted(alerts - quiet)}"
