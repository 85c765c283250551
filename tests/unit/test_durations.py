"""Durations as flags and variables take them, and as reports show them."""

from __future__ import annotations

import pytest

from reaper.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("1.5h", 5400.0), ("250ms", 0.25), ("2d", 172800.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "-5", "1h30m", "m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (5, 600, 7200, 200000)] == ["5s", "10m", "2h", "2d"]
