"""Report-only unless reaping is chosen, and hand runs that cannot shorten the grace.

The agent's --mode is scan unless reap is given; a pass adds to an attachment's ownerless count
only half of --interval after the pass that last did (a fake clock here: each pass's `now`); a
--min-age under a minute warns; a `reap` where REAPER_MODE is scan is refused unless --force."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from reaper.cli import _subparser, build_parser
from reaper.model import AttachmentHistory, Policy
from reaper.reconcile import reconcile
from reaper.settings import agent_settings_from, scan_mode_refusal, settings_from
from reaper.state import State, load_state, save_state
from tests.harness.snapshots import cache, lease, runtime, sandbox, snapshot

NOW = 1_700_000_000.0
OLD = NOW - 3600.0
SPACED = Policy(min_age=600.0, confirmations=2, stuck_after=900.0, confirmation_spacing=30.0)
LEAK = snapshot(leases=(lease(1, OLD),), caches=(cache(1, OLD, with_netns=False),))
KEY = "c" * 64


def passes(times: list[float], policy: Policy = SPACED) -> list[tuple[str, str, AttachmentHistory]]:
    """Each pass's verdict, reason and saved history of the one leaked attachment, in order."""
    history: dict[str, AttachmentHistory] = {}
    out: list[tuple[str, str, AttachmentHistory]] = []
    for now in times:
        report, history = reconcile(LEAK, runtime(), history, policy, now)
        (a,) = report.attachments
        out.append((a.verdict, a.reason, history[a.key.as_text()]))
    return out


def test_a_second_pass_seconds_after_the_first_does_not_confirm() -> None:
    first, second, third = passes([NOW, NOW + 5, NOW + 31])
    assert first[0] == "pending" and "1 of 2" in first[1]
    assert second[0] == "pending" and "1 of 2" in second[1], "a run 5s later is the same look"
    assert "5s after the last counted one" in second[1] and "30s after it" in second[1]
    assert second[2] == AttachmentHistory(first[2].first_seen, 1, NOW), "held, and still counted from the first"
    # Spaced from the pass that counted, not from the one that did not.
    assert third[0] == "orphan" and third[2].counted_at == NOW + 31


def test_an_orphan_stays_one_in_a_run_right_after_the_pass_that_made_it() -> None:
    """`reap --dry-run`, then `reap` seconds later: the plan's orphans are still orphans."""
    verdicts = [v for v, _, _ in passes([NOW, NOW + 60, NOW + 62, NOW + 63])]
    assert verdicts == ["pending", "orphan", "orphan", "orphan"]


@given(gaps=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=12))
def test_no_sequence_of_runs_counts_faster_than_one_a_spacing(gaps: list[float]) -> None:
    times = [NOW]
    for gap in gaps:
        times.append(times[-1] + gap)
    policy = Policy(min_age=0.0, confirmations=50, stuck_after=900.0, confirmation_spacing=30.0)
    for when, (_, _, saved) in zip(times, passes(times, policy), strict=True):
        assert saved.orphan_streak <= 1 + (when - NOW) // 30.0


def test_an_agent_whose_passes_are_an_interval_apart_counts_each() -> None:
    interval = 60.0
    policy = Policy(min_age=0.0, confirmations=5, stuck_after=900.0, confirmation_spacing=interval / 2)
    # The agent's jitter only delays a start by up to 10% of the interval.
    times = [NOW, NOW + 66, NOW + 120, NOW + 186, NOW + 240]
    assert [saved.orphan_streak for _, _, saved in passes(times, policy)] == [1, 2, 3, 4, 5]


def test_a_time_after_now_in_the_file_holds_the_count_back_one_spacing_only() -> None:
    key = reconcile(LEAK, runtime(), {}, SPACED, NOW)[0].attachments[0].key.as_text()
    forged = {key: AttachmentHistory(OLD, 1, NOW + 10**9)}
    report, history = reconcile(LEAK, runtime(), forged, SPACED, NOW)
    assert report.attachments[0].verdict == "pending" and history[key] == AttachmentHistory(OLD, 1, NOW)
    report, history = reconcile(LEAK, runtime(), history, SPACED, NOW + 30)
    assert report.attachments[0].verdict == "orphan"


def test_an_owner_seen_starts_the_count_over() -> None:
    (_, history) = reconcile(LEAK, runtime(), {}, SPACED, NOW)
    (report, history) = reconcile(LEAK, runtime(sandbox(1, created_at=OLD)), history, SPACED, NOW + 1)
    key = report.attachments[0].key.as_text()
    assert report.attachments[0].verdict == "live" and history[key] == AttachmentHistory(NOW, 0, None)
    (report, history) = reconcile(LEAK, runtime(), history, SPACED, NOW + 2)
    assert history[key].orphan_streak == 1 and history[key].counted_at == NOW + 2


def test_when_a_count_last_rose_is_saved_and_an_older_file_counts_the_next_pass(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    key, other = f"{KEY}/mynet/eth0", f"{KEY}/other/eth0"
    saved = State({key: AttachmentHistory(NOW - 10, 1, NOW - 5), other: AttachmentHistory(NOW, 0)}, {})
    save_state(str(path), saved)
    assert json.loads(path.read_text())["attachments"] == {key: [NOW - 10, 1, NOW - 5], other: [NOW, 0, 0]}
    assert load_state(str(path)) == (saved, None)
    # A file version 2 wrote: no times, so the next pass counts as it always did.
    path.write_text(json.dumps({"version": 2, "attachments": {key: [NOW - 10, 1]}}))
    assert load_state(str(path)) == (State({key: AttachmentHistory(NOW - 10, 1, None)}, {}), None)
    # A time no clock gives is no pass's writing; nor is a version 2 entry in a version 3 file.
    for entry in ([NOW, 1, float("inf")], [NOW, 1, -1.0], [NOW, 1]):
        path.write_text(json.dumps({"version": 3, "attachments": {key: entry}}).replace("Infinity", "1e400"))
        state, warning = load_state(str(path))
        assert state.attachments == {} and warning is not None and "is corrupt" in warning, entry


def test_the_spacing_is_half_the_interval_a_one_shot_reads_from_its_environment() -> None:
    parser = build_parser()
    assert settings_from(parser.parse_args(["scan"]), {}).policy.confirmation_spacing == 30
    assert settings_from(parser.parse_args(["reap"]), {"REAPER_INTERVAL": "5m"}).policy.confirmation_spacing == 150
    assert settings_from(parser.parse_args(["run", "--interval", "10s"]), {}).policy.confirmation_spacing == 5


def test_the_agent_reports_only_unless_reap_is_chosen() -> None:
    parser = build_parser()
    assert agent_settings_from(parser.parse_args(["run"]), {}).mode == "scan"
    assert agent_settings_from(parser.parse_args(["run", "--mode", "reap"]), {}).mode == "reap"
    assert agent_settings_from(parser.parse_args(["run"]), {"REAPER_MODE": "reap"}).mode == "reap"
    run = _subparser(parser, "run")
    assert run is not None and "report-only, the default" in " ".join(run.format_help().split())


def test_a_min_age_under_a_minute_is_taken_with_a_warning() -> None:
    parser = build_parser()

    def problems(*argv: str, env: dict[str, str] | None = None) -> list[str]:
        settings = settings_from(parser.parse_args(["scan", *argv]), env or {})
        return [p for p in settings.given_problems if "min-age" in p.lower() or "MIN_AGE" in p]

    (line,) = problems("--min-age", "1ms")
    assert line.startswith("--min-age 0.001s is under 1m") and "\n" not in line
    (line,) = problems(env={"REAPER_MIN_AGE": "0"})
    assert line.startswith("REAPER_MIN_AGE 0s is under 1m")
    assert settings_from(parser.parse_args(["scan", "--min-age", "0"]), {}).policy.min_age == 0
    assert problems() == [] and problems("--min-age", "1m") == []


def test_a_reap_where_the_mode_is_scan_is_refused_unless_forced_or_dry() -> None:
    parser = build_parser()
    reap = parser.parse_args(["reap"])
    refusal = scan_mode_refusal(reap, {"REAPER_MODE": "scan"})
    assert refusal is not None and "REAPER_MODE is scan" in refusal and "--force" in refusal
    assert scan_mode_refusal(reap, {"REAPER_MODE": "SCAN"}) is not None
    assert scan_mode_refusal(parser.parse_args(["reap", "--force"]), {"REAPER_MODE": "scan"}) is None
    assert scan_mode_refusal(parser.parse_args(["reap", "--dry-run"]), {"REAPER_MODE": "scan"}) is None
    assert scan_mode_refusal(reap, {"REAPER_MODE": "reap"}) is None
    assert scan_mode_refusal(reap, {}) is None, "a timer's reap, with no mode configured, is its own choice"


def test_explain_says_when_the_count_last_rose() -> None:
    from reaper.explain import _history  # noqa: PLC0415

    said = _history(AttachmentHistory(NOW - 3600, 1, NOW - 5), 2, NOW)
    assert (
        said
        == "first seen 60m ago; ownerless on 1 consecutive earlier passes (--confirmations 2), the last counted 5s ago"
    )
    assert "last counted" not in _history(AttachmentHistory(NOW - 3600, 0, None), 2, NOW)
