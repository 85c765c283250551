"""The metrics each pass outcome sets, read back from the registry and its exposition."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper.metrics import PREFIX, ReaperMetrics, TextfileError, cumulative_exposition, write_textfile
from reaper.model import PASS_OUTCOMES, VERDICTS, PassOutcome
from reaper.state import counter_fits
from tests.harness.results import full_report, reap_result


def value(metrics: ReaperMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(PREFIX + name, labels)


def test_every_label_is_there_before_the_first_pass() -> None:
    metrics = ReaperMetrics()
    for verdict in VERDICTS:
        assert value(metrics, "attachments", verdict=verdict) == 0
    for outcome in PASS_OUTCOMES:
        assert value(metrics, "passes_total", outcome=outcome) == 0
    assert value(metrics, "reclaimed_total", kind="ipam", method="cni-del") == 0


def test_a_scan_sets_the_gauges_of_what_it_saw() -> None:
    metrics = ReaperMetrics()
    report = full_report()
    metrics.observe_scan(report)
    for verdict in VERDICTS:
        assert value(metrics, "attachments", verdict=verdict) == report.count(verdict)
    assert value(metrics, "resources", kind="ipam", verdict="orphan") == 1
    assert value(metrics, "resources", kind="veth", verdict="live") == 1
    assert value(metrics, "ipam_range_used", network="mynet", range="10.0.0.0/24") == 64
    assert value(metrics, "ipam_range_size", network="mynet", range="10.0.0.0/24") == 254
    assert value(metrics, "stuck_sandboxes") == 1
    assert value(metrics, "corrupt_files", kind="ipam") == 2
    assert value(metrics, "runtime_up") == 1


def test_a_range_gone_from_the_next_scan_leaves_no_series() -> None:
    metrics = ReaperMetrics()
    metrics.observe_scan(full_report())
    metrics.observe_scan(replace(full_report(), ranges=()))
    assert value(metrics, "ipam_range_used", network="mynet", range="10.0.0.0/24") is None


def test_an_undecided_scan_says_the_runtime_is_down() -> None:
    metrics = ReaperMetrics()
    metrics.observe_scan(full_report(reachable=False))
    assert value(metrics, "runtime_up") == 0
    assert value(metrics, "attachments", verdict="orphan") == 0
    assert value(metrics, "attachments", verdict="unknown") == 1


def test_a_reap_counts_what_it_freed_left_and_skipped() -> None:
    metrics = ReaperMetrics()
    metrics.observe_reap(reap_result())
    assert value(metrics, "reclaimed_total", kind="ipam", method="cni-del") == 1
    assert value(metrics, "reclaimed_total", kind="veth", method="kernel") == 1
    assert value(metrics, "reclaim_errors_total", kind="cache", method="kernel") == 1
    assert value(metrics, "plugin_del_errors_total") == 1
    assert value(metrics, "skipped_attachments_total") == 1
    assert value(metrics, "breaker_open") == 0
    assert value(metrics, "state_write_errors_total") == 0
    metrics.observe_reap(reap_result())
    assert value(metrics, "reclaimed_total", kind="ipam", method="cni-del") == 2, "counters add up"


def test_a_breaker_pass_and_a_failed_state_write() -> None:
    metrics = ReaperMetrics()
    metrics.observe_reap(
        reap_result(breaker_open=True, breaker_reason="x", reclaimed=(), skipped=(), state_saved=False)
    )
    assert value(metrics, "breaker_open") == 1
    assert value(metrics, "state_write_errors_total") == 1
    assert value(metrics, "reclaimed_total", kind="ipam", method="cni-del") == 0


@pytest.mark.parametrize("outcome", PASS_OUTCOMES)
def test_each_pass_outcome_is_counted_and_only_a_decided_one_is_a_success(outcome: PassOutcome) -> None:
    metrics = ReaperMetrics()
    metrics.observe_pass(2.0, outcome, 1234.0)
    assert value(metrics, "passes_total", outcome=outcome) == 1
    assert value(metrics, "pass_duration_seconds_count") == 1
    assert value(metrics, "pass_duration_seconds_sum") == 2.0
    success = value(metrics, "last_pass_success_timestamp_seconds")
    assert success == (1234.0 if outcome in ("ok", "breaker") else 0)


def test_the_exposition_is_prometheus_text() -> None:
    metrics = ReaperMetrics()
    metrics.observe_reap(reap_result())
    text = metrics.exposition().decode()
    assert "# TYPE cni_reaper_reclaimed_total counter" in text
    assert 'cni_reaper_reclaimed_total{kind="ipam",method="cni-del"} 1.0' in text


def test_write_textfile_replaces_the_file_and_a_symlink_at_its_place(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"untouched")
    target = tmp_path / "reaper.prom"
    target.symlink_to(elsewhere)
    write_textfile(str(target), b"cni_reaper_up 1\n")
    assert not target.is_symlink()
    assert target.read_bytes() == b"cni_reaper_up 1\n"
    assert elsewhere.read_bytes() == b"untouched"
    assert os.stat(target).st_mode & 0o777 == 0o644


def test_write_textfile_into_a_missing_dir_raises_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(TextfileError, match="cannot write textfile"):
        write_textfile(str(tmp_path / "missing" / "reaper.prom"), b"x")


def test_a_textfile_sums_every_runs_counters_and_only_the_counters() -> None:
    """Each one-shot run's textfile carries what earlier runs counted (kept in the state file),
    so a run that counts what the last one counted still shows an increase."""
    totals: dict[str, float] = {}
    for run in range(1, 4):
        metrics = ReaperMetrics()
        metrics.observe_pass(2.0, "ok", 1000.0 + run)
        metrics.stuck.set(run)
        text, totals = cumulative_exposition(metrics.registry, totals)
        lines = text.decode().splitlines()
        assert f'cni_reaper_passes_total{{outcome="ok"}} {float(run)}' in lines
        assert f"cni_reaper_pass_duration_seconds_count {float(run)}" in lines
        assert f"cni_reaper_pass_duration_seconds_sum {2.0 * run}" in lines
        assert f"cni_reaper_stuck_sandboxes {float(run)}" in lines, "a gauge is this run's alone"
        assert not [line for line in lines if "_created" in line], "a run's start is no counter's creation"
    assert totals and all(counter_fits(k, v) for k, v in totals.items()), "the state file takes every total"
    assert not [k for k in totals if k.startswith("cni_reaper_stuck")]
