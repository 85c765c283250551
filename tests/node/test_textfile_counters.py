"""The timer's textfile, read the way a node reads it: node_exporter's textfile collector (the
Debian package's real binary) serves the file each one-shot `reaper reap` rewrites, and a real
Prometheus scrapes it. Each run reclaims the same number of leaks; the counters must still go
up run after run, so that increase() in the alerts and dashboard counts every run's work."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from tests.harness.agent import http_get
from tests.harness.lab import Lab
from tests.harness.reap_helpers import REAP, leak_left
from tests.harness.reaper_cli import run_reaper

PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter")
RUNS = 3

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or NODE_EXPORTER is None,
    reason="prometheus and prometheus-node-exporter (Debian packages, make deps) are not installed",
)


def query(lab: Lab, expr: str) -> list[dict[str, object]]:
    url = "http://127.0.0.1:9090/api/v1/query?query=" + urllib.parse.quote(expr)
    status, body = http_get(lab, url)
    if status != 200:
        return []
    result: list[dict[str, object]] = json.loads(body)["data"]["result"]
    return result


def value_of(lab: Lab, expr: str, want: float, timeout: float = 30.0) -> float | None:
    """The query's single value once it is `want` (or whatever it last was, at the timeout)."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        found = query(lab, expr)
        if found:
            value = found[0]["value"]
            assert isinstance(value, list)
            seen = float(value[1])
            if seen == want:
                return seen
        time.sleep(0.5)
    return seen


def test_counters_in_the_textfile_grow_across_one_shot_runs(lab: Lab, tmp_path: Path) -> None:
    assert PROMETHEUS is not None and NODE_EXPORTER is not None
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": ["127.0.0.1:9100"]}]}],
    }))  # fmt: skip
    exporter = subprocess.Popen(
        ["nsenter", f"--net={lab.netns_path}", NODE_EXPORTER, "--web.listen-address=127.0.0.1:9100",
         "--collector.disable-defaults", "--collector.textfile", f"--collector.textfile.directory={textfiles}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    prometheus = subprocess.Popen(
        ["nsenter", f"--net={lab.netns_path}", PROMETHEUS, f"--config.file={config}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--web.listen-address=127.0.0.1:9090"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115
    )  # fmt: skip
    state = tmp_path / "state.json"
    try:
        for run in range(1, RUNS + 1):
            leak = lab.make_leak()
            done = run_reaper(lab, "reap", state, *REAP, "--textfile", str(textfiles / "cni_reaper.prom"))
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr
            assert leak_left(lab, leak) == []
            # Every run reclaimed one lease, as the run before did: the series still went up.
            reclaimed = 'sum(cni_reaper_reclaimed_total{kind="ipam"})'
            assert value_of(lab, reclaimed, float(run)) == float(run), f"run {run}"
            assert value_of(lab, 'cni_reaper_passes_total{outcome="ok"}', float(run)) == float(run)
        assert value_of(lab, "sum(resets(cni_reaper_passes_total[5m]))", 0.0) == 0.0
        grown = value_of(lab, 'sum(increase(cni_reaper_reclaimed_total{kind="ipam"}[5m]))', -1.0, timeout=3)
        assert grown is not None and grown >= RUNS - 1, "increase() sees every run after the first"
        # The counters are the state file's: a new state file starts them over (a counter reset).
        saved = json.loads(state.read_text())["counters"]
        assert saved['cni_reaper_passes_total{outcome="ok"}'] == float(RUNS)
    finally:
        for proc in (prometheus, exporter):
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
