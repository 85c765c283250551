"""`reaper run` on the lab: metrics, health, the textfile, a clean stop, and alerts that fire
in a real Prometheus scraping it."""

from __future__ import annotations

import json
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from reaper.metrics import installed_version
from tests.harness.agent import LabAgent, http_get, metric
from tests.harness.lab import Lab
from tests.harness.reaper_cli import run_reaper

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "cni-reaper-rules.yaml"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
FAST = ("--min-age", "0", "--confirmations", "1")


# The live pod the agent's figures count, beside the leaks each test makes.
pytestmark = pytest.mark.usefixtures("web")


def test_agent_scan_mode_serves_metrics_health_and_stops_cleanly(lab: Lab, tmp_path: Path) -> None:
    leak = lab.make_leak(with_cache=True)
    agent = LabAgent(
        lab, tmp_path / "state.json", "--mode", "scan", "--interval", "2s", *FAST, "--max-orphan-ratio", "0.2"
    )
    try:
        assert agent.wait_for("/healthz", 200) == "ok\n"
        agent.wait_for("/readyz", 200)
        body = agent.wait_for("/metrics", 200)
        assert metric(body, "cni_reaper_attachments", verdict="orphan") >= 1
        assert metric(body, "cni_reaper_attachments", verdict="live") == 2  # web: eth0 and cni-loopback
        assert metric(body, "cni_reaper_resources", kind="veth", verdict="orphan") == 1
        assert metric(body, "cni_reaper_runtime_up") == 1
        # Report-only, and a reap would stop at the breaker: 1 of the 2 pod attachments orphaned.
        assert metric(body, "cni_reaper_build_info", version=installed_version(), mode="scan") == 1
        assert metric(body, "cni_reaper_breaker_open") == 1
        assert metric(body, "cni_reaper_ipam_range_used", network=lab.network_name, range=lab.subnet) == 2
        assert metric(body, "cni_reaper_ipam_range_size", network=lab.network_name, range=lab.subnet) == 253
        assert metric(body, "cni_reaper_last_pass_success_timestamp_seconds") > time.time() - 60
        assert leak.lease_path.exists(), "scan mode reclaims nothing"
        if PROMTOOL:
            check = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
        assert agent.get("/nope")[0] == 404
        # A clean stop: exit 0 (LabAgent.stop waits 20 s, then kills) and its last line below. How
        # long a stop takes is bench/agent_idle.py's figure.
        assert agent.stop() == 0
    finally:
        agent.stop()
    lines = agent.log_lines()
    passes = [line for line in lines if line["msg"] == "pass"]
    assert passes and all(p["mode"] == "scan" and p["outcome"] == "ok" for p in passes)
    assert lines[-1]["msg"] == "agent stopped"
    run_reaper(lab, "reap", tmp_path / "cleanup.json", *FAST, "--max-orphan-ratio", "1")


def test_agent_reap_mode_reclaims_and_counts(lab: Lab, tmp_path: Path) -> None:
    leak = lab.make_leak(with_cache=True)
    agent = LabAgent(
        lab, tmp_path / "state.json", "--mode", "reap", "--interval", "2s", *FAST, "--max-orphan-ratio", "1"
    )
    try:
        deadline = time.monotonic() + 30
        while (leak.lease_path.exists() or leak.netns_path.exists()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not leak.lease_path.exists() and not leak.netns_path.exists()
        body = agent.wait_for_metric("cni_reaper_reclaimed_total", lambda n: n > 0, kind="ipam", method="cni-del")
        assert metric(body, "cni_reaper_reclaimed_total", kind="ipam", method="cni-del") == 1
        assert metric(body, "cni_reaper_reclaimed_total", kind="netns", method="kernel") == 1
        assert metric(body, "cni_reaper_reclaim_errors_total", kind="ipam", method="cni-del") == 0
        assert metric(body, "cni_reaper_breaker_open") == 0
    finally:
        assert agent.stop() == 0
    reclaimed = [line for line in agent.log_lines() if line["msg"] == "reclaimed"]
    assert any(leak.container_id in str(line["attachment"]) for line in reclaimed)


MAX_SERIES = 100  # per node with no leaks: what 5,000 nodes cost a Prometheus is 5,000 times this


def series(body: str) -> list[str]:
    """The samples of an exposition: one line each, comments and blank lines aside."""
    return [line for line in body.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("mode", ["scan", "reap"])
def test_a_node_with_no_leaks_costs_at_most_100_series(lab: Lab, tmp_path: Path, mode: str) -> None:
    """The real agent on the lab (one live pod, no leak), after its first pass: the series of
    /metrics, counted as Prometheus stores them. No `_created` sample among them."""
    agent = LabAgent(lab, tmp_path / "state.json", "--mode", mode, "--interval", "1h", *FAST)
    try:
        body = agent.wait_for_metric("cni_reaper_last_pass_success_timestamp_seconds", lambda t: t > 0)
    finally:
        assert agent.stop() == 0
    samples = series(body)
    assert metric(body, "cni_reaper_attachments", verdict="orphan") == 0
    assert not [s for s in samples if s.split("{")[0].split()[0].endswith("_created")]
    assert len(samples) <= MAX_SERIES, f"{len(samples)} series:\n" + "\n".join(samples)


def test_readyz_fails_while_the_runtime_is_down(lab: Lab, tmp_path: Path) -> None:
    agent = LabAgent(lab, tmp_path / "state.json", "--mode", "scan", "--interval", "1s", "--runtime-timeout", "1s")
    try:
        agent.wait_for("/readyz", 200)
        lab.stop_runtime()
        try:
            why = agent.wait_for("/readyz", 503, timeout=30)
            assert "has not answered" in why
            body = agent.get("/metrics")[1]
            assert metric(body, "cni_reaper_runtime_up") == 0
            assert metric(body, "cni_reaper_passes_total", outcome="undecided") >= 1
        finally:
            lab.start_runtime()
        agent.wait_for("/readyz", 200, timeout=30)
    finally:
        assert agent.stop() == 0


def test_bad_agent_flags_are_one_line_errors(lab: Lab) -> None:
    for flags, message in (
        (["--mode", "delete"], "--mode='delete': must be scan or reap"),
        (["--listen", "nowhere"], "--listen='nowhere': not HOST:PORT"),
        (["--interval", "0s"], "--interval='0s': must be at least 1s"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "reaper", "run", *flags], capture_output=True, text=True, timeout=30, check=False
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"reaper: {message}"), proc.stderr


def test_textfile_is_replaced_atomically_with_mode_0644(lab: Lab, tmp_path: Path) -> None:
    textfile = tmp_path / "cni_reaper.prom"
    # A symlink planted where the textfile goes is replaced, never written through.
    victim = tmp_path / "victim"
    victim.write_text("keep")
    textfile.symlink_to(victim)
    run = run_reaper(lab, "scan", tmp_path / "state.json", *FAST, "--textfile", str(textfile))
    assert run.returncode in (0, 1), run.stderr
    assert victim.read_text() == "keep" and not textfile.is_symlink()
    assert stat.S_IMODE(textfile.stat().st_mode) == 0o644
    body = textfile.read_text()
    assert metric(body, "cni_reaper_attachments", verdict="live") == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".cni_reaper")] == []
    if PROMTOOL:
        check = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_one_shot_scans_textfile_says_whether_a_reap_would_stop_at_the_breaker(lab: Lab, tmp_path: Path) -> None:
    """The timer's report-only run exports the breaker as the agent's scan mode does, by the
    ratio a reap there would use (its variable, as the reap drop-in would set it). Before: the
    one-shot never weighed it, and the gauge said 0 whatever a reap would do."""
    lab.make_leak(with_cache=True)  # 1 of the 2 pod attachments orphaned, beside `web`
    textfile = tmp_path / "cni_reaper.prom"
    try:
        for ratio, tripped in (("0.2", 1), ("1", 0)):
            wrap = ("env", f"REAPER_MAX_ORPHAN_RATIO={ratio}")
            run = run_reaper(lab, "scan", tmp_path / "state.json", *FAST, "--textfile", str(textfile), wrap=wrap)
            assert run.returncode == 1, run.stderr  # orphans found
            assert metric(textfile.read_text(), "cni_reaper_breaker_open") == tripped, ratio
    finally:
        run_reaper(lab, "reap", tmp_path / "cleanup.json", *FAST, "--max-orphan-ratio", "1")


def fast_rules(path: Path) -> None:
    """The real rules with `for:` and range windows shrunk to seconds, for a test that cannot
    wait an hour; the expressions are otherwise the shipped ones."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
            rule["expr"] = re.sub(r"\[\d+[mh]\]", "[10s]", rule["expr"])
    path.write_text(yaml.safe_dump(doc))


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus (Debian package) is not installed")
def test_a_real_prometheus_fires_the_leak_alert(lab: Lab, tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    rules = tmp_path / "rules.yaml"
    fast_rules(rules)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {
                        "job_name": "cni-reaper",
                        "static_configs": [{"targets": ["127.0.0.1:9753"], "labels": {"node": "lab-node"}}],
                    }
                ],
            }
        )
    )
    agent = LabAgent(lab, tmp_path / "state.json", "--mode", "scan", "--interval", "1s", *FAST)
    prometheus = subprocess.Popen(
        [
            "nsenter", f"--net={lab.netns_path}", PROMETHEUS, f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--web.listen-address=127.0.0.1:9090",
        ],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115
    )  # fmt: skip
    try:
        agent.wait_for("/readyz", 200)
        assert _firing(lab, "CniReaperLeaksPersist", timeout=5) == [], "no leak yet, no alert"
        leak = lab.make_leak(with_cache=False)
        alerts = _firing(lab, "CniReaperLeaksPersist", timeout=60)
        assert alerts and alerts[0]["labels"]["node"] == "lab-node"
        assert "lab-node has had orphaned CNI attachments" in alerts[0]["annotations"]["description"]
        # The agent is in scan mode (its build_info says so): the leak is for reading, not paging.
        assert [a["labels"]["severity"] for a in alerts] == ["info"]
        assert "in scan mode" in alerts[0]["annotations"]["description"]
        assert leak.lease_path.exists()
    finally:
        prometheus.send_signal(signal.SIGTERM)
        prometheus.wait(20)
        assert agent.stop() == 0
    run_reaper(lab, "reap", tmp_path / "cleanup.json", *FAST, "--max-orphan-ratio", "1")


def _firing(lab: Lab, name: str, timeout: float) -> list[dict[str, dict[str, str]]]:
    """The firing alerts called `name`, once there are some or `timeout` has passed."""
    deadline = time.monotonic() + timeout
    found: list[dict[str, dict[str, str]]] = []
    while time.monotonic() < deadline:
        status, body = http_get(lab, "http://127.0.0.1:9090/api/v1/alerts")
        if status == 200:
            alerts = json.loads(body)["data"]["alerts"]
            found = [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]
            if found:
                return found
        time.sleep(0.5)
    return found
