"""Durations as flags and variables take them, and as reports show them."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from apscheduler.triggers.interval import IntervalTrigger

from reaper.agent import JITTER
from reaper.durations import ACCEPTED, MAX_SECONDS, format_duration, parse_duration
from reaper.runtime.client import RuntimeClient
from tests.harness.fake_cri import FakeRuntime, sandbox_list


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("250ms", 0.25),
        ("2d", 172800.0),
        # Compound, as Go's time.ParseDuration: each part a number with its unit.
        ("1h30m", 5400.0),
        ("1m30.5s", 90.5),
        ("1d12h", 129600.0),
        ("2m3ms", 120.003),
        ("30s1h", 3630.0),
        (" 10m ", 600.0),
        ("-0", 0.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "10x", "m", "1h 30m", "1h30", "30m1", "1h-30m", "+5", "5us", "-abc"])
def test_bad_durations_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration: use seconds") as err:
        parse_duration(text)
    assert ACCEPTED in str(err.value)


@pytest.mark.parametrize("text", ["-5", "-1h30m", " -10m"])
def test_negative_durations_say_so(text: str) -> None:
    with pytest.raises(ValueError, match=r"^must not be negative$"):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (5, 600, 7200, 200000)] == ["5s", "10m", "2h", "2d"]


@pytest.mark.parametrize("text", ["365d", "8760h", "31536000", "364d23h59m59s"])
def test_a_year_is_taken(text: str) -> None:
    assert parse_duration(text) <= MAX_SECONDS


@pytest.mark.parametrize("text", ["366d", "365d1ms", "31536000.5", "99999999999999999999d", "9" * 400])
def test_more_than_a_year_is_refused_with_the_bound(text: str) -> None:
    """Issue 35: `--interval 99999999999999999999d` was apscheduler's OverflowError, and a
    huge `--runtime-timeout` made a reachable runtime DEADLINE_EXCEEDED (400 nines is inf)."""
    with pytest.raises(ValueError, match=r"^more than a year: give at most 365d$"):
        parse_duration(text)


def test_the_longest_runtime_timeout_is_a_deadline_grpc_keeps(tmp_path: Path) -> None:
    """The bound is one the CRI client takes: a call with a year's deadline is answered (past
    about 300 years grpc took the deadline as already passed)."""
    socket = tmp_path / "cri.sock"
    with FakeRuntime(socket, sandbox_list([]), {}):
        client = RuntimeClient(f"unix://{socket}", MAX_SECONDS)
        try:
            assert client.version().runtime_name == "fake-cri"
        finally:
            client.close()


def test_the_longest_interval_is_one_the_scheduler_takes() -> None:
    """The agent's IntervalTrigger with a year's interval and its jitter (reaper.agent)."""
    trigger = IntervalTrigger(seconds=MAX_SECONDS, jitter=int(MAX_SECONDS * JITTER), timezone=datetime.UTC)
    now = datetime.datetime.now(datetime.UTC)
    following = trigger.get_next_fire_time(now, now)
    assert following is not None and following > now
