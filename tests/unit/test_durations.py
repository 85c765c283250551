"""Durations as flags and variables take them, and as reports show them."""

from __future__ import annotations

import pytest

from reaper.durations import ACCEPTED, format_duration, parse_duration


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
