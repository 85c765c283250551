"""The metrics each pass outcome sets, read back from the registry and its exposition."""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

import pytest
from msgspec.structs import replace
from prometheus_client.parser import text_string_to_metric_families

from reaper.kinds.registry import REGISTRY
from reaper.metrics import (
    METHODS_OF,
    PREFIX,
    Mode,
    ReaperMetrics,
    TextfileError,
    cumulative_exposition,
    installed_version,
    parse_sample_key,
    write_textfile,
)
from reaper.model import PASS_OUTCOMES, VERDICTS, PassOutcome
from reaper.state import counter_fits
from tests.harness.results import full_report, reap_result


def value(metrics: ReaperMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(PREFIX + name, labels)


def test_every_label_is_there_before_the_first_pass() -> None:
    metrics = ReaperMetrics(mode="reap")
    for verdict in VERDICTS:
        assert value(metrics, "attachments", verdict=verdict) == 0
    for outcome in PASS_OUTCOMES:
        assert value(metrics, "passes_total", outcome=outcome) == 0


def test_build_info_names_the_version_and_the_mode() -> None:
    for mode in ("scan", "reap"):
        metrics = ReaperMetrics(mode=mode, version="1.2.3")
        assert value(metrics, "build_info", version="1.2.3", mode=mode) == 1
        other = "reap" if mode == "scan" else "scan"
        assert value(metrics, "build_info", version="1.2.3", mode=other) is None
    installed = ReaperMetrics(mode="scan")
    assert value(installed, "build_info", version=installed_version(), mode="scan") == 1
    assert installed_version() == version("cni-reaper"), "the installed distribution's, as --version says"


def test_the_endpoint_has_no_created_samples() -> None:
    metrics = ReaperMetrics(mode="reap")
    metrics.observe_reap(reap_result())
    metrics.observe_pass(1.0, "ok", 1000.0)
    text = metrics.exposition().decode()
    assert "cni_reaper_passes_total" in text and "cni_reaper_pass_duration_seconds_bucket" in text
    assert "_created" not in text
    # The registry itself still has them: the view leaves prometheus_client's own state alone.
    assert value(metrics, "passes_created", outcome="ok") is not None


def exported_pairs(metrics: ReaperMetrics, name: str) -> set[tuple[str, str]]:
    text = metrics.exposition().decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == PREFIX + name)
    return {(s.labels["kind"], s.labels["method"]) for s in family.samples}


def test_reclaim_counters_only_for_methods_that_can_free_their_kind() -> None:
    """Each kind's possible methods come from the kind itself: a plugin's DEL frees neither a
    namespace pin nor a cache entry; only the quarantinable kinds are quarantined; a held
    namespace is never freed."""
    assert METHODS_OF["veth"] == ("cni-del", "kernel")
    assert METHODS_OF["netns"] == ("kernel",)
    assert METHODS_OF["nspins"] == ("kernel",)
    assert METHODS_OF["cache"] == ("kernel", "quarantine")
    assert METHODS_OF["ipam"] == ("cni-del", "kernel", "quarantine")
    assert METHODS_OF["heldns"] == ()
    assert set(METHODS_OF) == set(REGISTRY.names)
    metrics = ReaperMetrics(mode="reap")
    assert exported_pairs(metrics, "reclaimed") == set(), "none before a pass sees something to reclaim"
    pending = replace(
        full_report(),
        attachments=tuple(a for a in full_report().attachments if a.verdict in ("pending", "live")),
    )
    metrics.observe_scan(pending)  # a pending attachment with an ipam lease and a veth
    expected = {
        ("ipam", "cni-del"),
        ("ipam", "kernel"),
        ("ipam", "quarantine"),
        ("veth", "cni-del"),
        ("veth", "kernel"),
    }
    assert exported_pairs(metrics, "reclaimed") == expected
    assert exported_pairs(metrics, "reclaim_errors") == expected
    assert value(metrics, "reclaimed_total", kind="veth", method="quarantine") is None
    for kind, method in expected:
        assert value(metrics, "reclaimed_total", kind=kind, method=method) == 0


def test_scan_mode_has_no_reclaim_counters() -> None:
    metrics = ReaperMetrics(mode="scan")
    metrics.observe_scan(full_report())
    assert exported_pairs(metrics, "reclaimed") == set()
    assert exported_pairs(metrics, "reclaim_errors") == set()


def test_gauges_by_kind_appear_once_seen_and_stay() -> None:
    metrics = ReaperMetrics(mode="reap")
    clean = replace(full_report(), attachments=tuple(a for a in full_report().attachments if a.verdict == "live"))
    metrics.observe_scan(replace(clean, corrupt=()))
    assert value(metrics, "resources", kind="veth", verdict="live") == 1
    assert value(metrics, "resources", kind="veth", verdict="orphan") is None, "never seen: no series"
    assert value(metrics, "corrupt_files", kind="ipam") is None
    metrics.observe_scan(full_report())
    assert value(metrics, "resources", kind="veth", verdict="orphan") == 1
    assert value(metrics, "corrupt_files", kind="ipam") == 2
    metrics.observe_scan(replace(clean, corrupt=()))
    assert value(metrics, "resources", kind="veth", verdict="orphan") == 0, "once there, it stays, at 0"
    assert value(metrics, "corrupt_files", kind="ipam") == 0


def series_count(metrics: ReaperMetrics) -> int:
    return sum(1 for line in metrics.exposition().decode().splitlines() if line and not line.startswith("#"))


@pytest.mark.parametrize("mode", ["scan", "reap"])
def test_a_node_with_no_leaks_costs_at_most_100_series(mode: Mode) -> None:
    """The registry as the agent builds it, after a pass over a node with live pods and no
    leak (tests/node/test_agent.py counts the real agent's /metrics on the lab)."""
    metrics = ReaperMetrics(mode=mode)
    live = replace(
        full_report(), attachments=tuple(a for a in full_report().attachments if a.verdict == "live"), corrupt=()
    )
    if mode == "reap":
        metrics.observe_reap(reap_result(report=live, reclaimed=(), skipped=()))
    else:
        metrics.observe_scan(live)
    metrics.observe_pass(1.0, "ok", 1000.0)
    assert series_count(metrics) <= 100


def test_a_textfile_keeps_a_counter_an_earlier_run_made_and_this_one_did_not() -> None:
    first = ReaperMetrics(mode="reap")
    first.observe_reap(reap_result())
    _, totals = cumulative_exposition(first.registry, {})
    assert totals['cni_reaper_reclaimed_total{kind="ipam",method="cni-del"}'] == 1
    later = ReaperMetrics(mode="reap")  # a run that saw nothing to reclaim
    text, again = cumulative_exposition(later.registry, totals)
    assert 'cni_reaper_reclaimed_total{kind="ipam",method="cni-del"} 1.0' in text.decode().splitlines()
    assert again == totals, "no count is lost from one run to the next"
    assert parse_sample_key('cni_reaper_reclaimed_total{kind="ipam",method="cni-del"}') == (
        "cni_reaper_reclaimed_total",
        {"kind": "ipam", "method": "cni-del"},
    )
    assert parse_sample_key("cni_reaper_passes_total") == ("cni_reaper_passes_total", {})
    assert parse_sample_key('x{a="1"} junk') is None


def test_a_scan_sets_the_gauges_of_what_it_saw() -> None:
    metrics = ReaperMetrics(mode="reap")
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
    metrics = ReaperMetrics(mode="reap")
    metrics.observe_scan(full_report())
    metrics.observe_scan(replace(full_report(), ranges=()))
    assert value(metrics, "ipam_range_used", network="mynet", range="10.0.0.0/24") is None


def test_an_undecided_scan_says_the_runtime_is_down() -> None:
    metrics = ReaperMetrics(mode="reap")
    metrics.observe_scan(full_report(reachable=False))
    assert value(metrics, "runtime_up") == 0
    assert value(metrics, "attachments", verdict="orphan") == 0
    assert value(metrics, "attachments", verdict="unknown") == 1


def test_a_reap_counts_what_it_freed_left_and_skipped() -> None:
    metrics = ReaperMetrics(mode="reap")
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
    metrics = ReaperMetrics(mode="reap")
    metrics.observe_reap(
        reap_result(breaker_open=True, breaker_reason="x", reclaimed=(), skipped=(), state_saved=False)
    )
    assert value(metrics, "breaker_open") == 1
    assert value(metrics, "state_write_errors_total") == 1
    assert value(metrics, "reclaimed_total", kind="ipam", method="cni-del") == 0


@pytest.mark.parametrize("outcome", PASS_OUTCOMES)
def test_each_pass_outcome_is_counted_and_only_a_decided_one_is_a_success(outcome: PassOutcome) -> None:
    metrics = ReaperMetrics(mode="reap")
    metrics.observe_pass(2.0, outcome, 1234.0)
    assert value(metrics, "passes_total", outcome=outcome) == 1
    assert value(metrics, "pass_duration_seconds_count") == 1
    assert value(metrics, "pass_duration_seconds_sum") == 2.0
    success = value(metrics, "last_pass_success_timestamp_seconds")
    assert success == (1234.0 if outcome in ("ok", "breaker") else 0)


def test_the_exposition_is_prometheus_text() -> None:
    metrics = ReaperMetrics(mode="reap")
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
        metrics = ReaperMetrics(mode="reap")
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
