"""The Prometheus alert rules: promtool's own checks and the project's rule unit tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "cni-reaper-rules.yaml"
# Every file of rule unit tests: cni-reaper-rules.test.yaml, and one per alert added since.
RULE_TESTS = sorted(Path(__file__).with_name("prometheus").glob("*.test.yaml"))
PROMTOOL = shutil.which("promtool")
# The README the runbook links open, by default (charts/cni-reaper/values.yaml has the same).
RUNBOOK_BASE = "https://github.com/cni-reaper/cni-reaper/blob/main/README.md"
LEAK_ALERTS = {"CniReaperLeaksPersist", "CniReaperOldOrphans"}


def alert_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load(RULES.read_text())
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def readme_anchors() -> set[str]:
    """GitHub's anchors of the README's headings."""
    text = (ROOT / "README.md").read_text()
    headings = [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")
def test_rules_pass_promtool_check_and_unit_tests() -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 15 rules found" in check.stdout, check.stdout + check.stderr
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


def test_every_alert_is_tested_with_a_node_in_scan_mode() -> None:
    """Each alert has a promtool case whose inputs hold a reaper in scan mode (report-only),
    so that what a report-only fleet raises is decided, not left to chance."""
    tests = [test for path in RULE_TESTS for test in yaml.safe_load(path.read_text())["tests"]]
    alerts = {r["alert"] for r in alert_rules()}
    with_scan = set()
    for test in tests:
        if any("cni_reaper_build_info{" in s["series"] and 'mode="scan"' in s["series"] for s in test["input_series"]):
            with_scan |= {c["alertname"] for c in test.get("alert_rule_test", [])}
    assert alerts <= with_scan, f"never tested with a node in scan mode: {sorted(alerts - with_scan)}"


def test_no_leak_alert_warns_for_a_reaper_in_scan_mode() -> None:
    """A leak alert's warning leaves scan mode out; its scan-mode twin is info. None pages:
    nothing is critical (an open breaker harms no workload)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for rule in alert_rules():
        by_name.setdefault(rule["alert"], []).append(rule)
        assert rule["labels"]["severity"] in ("warning", "info"), rule["alert"]
    scan_join = re.compile(r'\b(unless|and) ignoring \([^)]*\) cni_reaper_build_info\{mode="scan"\}$')
    for name in LEAK_ALERTS:
        severities = {}
        for rule in by_name[name]:
            joined = scan_join.search(" ".join(rule["expr"].split()))
            assert joined, f"{name}: no join with scan mode at the end of {rule['expr']!r}"
            severities[joined.group(1)] = rule["labels"]["severity"]
        assert severities == {"unless": "warning", "and": "info"}, name
    assert [r["labels"]["severity"] for r in by_name["CniReaperBreakerOpen"]] == ["warning"]


def test_every_runbook_link_is_absolute_and_opens_a_readme_section() -> None:
    anchors = readme_anchors()
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == RUNBOOK_BASE, rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: no README section #{anchor}"
        assert "runbook" not in rule["annotations"], "one link, absolute"
    values = yaml.safe_load((ROOT / "charts" / "cni-reaper" / "values.yaml").read_text())
    assert values["prometheusRule"]["runbookUrl"] == RUNBOOK_BASE


def test_target_down_and_absent_watch_the_charts_job() -> None:
    """The chart's ServiceMonitor names the job these alerts watch."""
    exprs = {r["alert"]: r["expr"] for r in alert_rules()}
    assert 'up{job="cni-reaper"} == 0' in exprs["CniReaperTargetDown"]
    assert 'absent(up{job="cni-reaper"})' in exprs["CniReaperTargetAbsent"]
    monitor = (ROOT / "charts" / "cni-reaper" / "templates" / "servicemonitor.yaml").read_text()
    assert "targetLabel: job" in monitor and "replacement: cni-reaper" in monitor
