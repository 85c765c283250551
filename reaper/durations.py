"""Durations given on the command line or in the environment, and durations as reports show them.

A duration is a bare number of seconds (`90`, `1.5`), or one or more numbers each with a unit,
largest first or not, as Go's time.ParseDuration reads them (`90s`, `10m`, `1h30m`, `1.5h`,
`250ms`), with `d` for days besides. What Go takes beyond that (a sign, `ns` and `us`) is not
taken: no setting here wants a negative or sub-millisecond time, and saying so beats reading one.

Nor does any want more than a year (MAX_SECONDS), and past some length each breaks where the
time is used, not where it was typed: apscheduler's interval overflows a C int
(`--interval 99999999999999999999d` was an OverflowError traceback), and grpc takes a deadline
hundreds of years away as already passed (a reachable runtime answered DEADLINE_EXCEEDED).
So every duration setting is bounded here, in its one parser, and a longer one is refused.
"""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"\d+(?:\.\d+)?"
# `ms` before `m`, so `250ms` is one part and not 250 minutes followed by junk.
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)")
_COMPOUND = re.compile(rf"(?:{_NUMBER}(?:ms|s|m|h|d))+")
_BARE = re.compile(_NUMBER)

# The longest duration any setting takes: a year. A test proves the places that use one take it
# (tests/unit/test_duration_bounds.py: a CRI call with a year's deadline is answered).
MAX_SECONDS = 365 * 86400.0

# What --help and the errors say is accepted, in one place.
ACCEPTED = "seconds (90) or numbers with a unit ms, s, m, h or d, one or more (10m, 1h30m, 1.5h), at most 365d"


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError saying what is wrong (the caller names the setting and
    shows the text) when it is not a duration of this form."""
    body = text.strip()
    negative = body.startswith("-")
    if negative:
        body = body[1:]
    if _BARE.fullmatch(body):
        seconds = float(body)
    elif _COMPOUND.fullmatch(body):
        seconds = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(body))
    else:
        raise ValueError(f"not a duration: use {ACCEPTED}")
    if negative and seconds:
        raise ValueError("must not be negative")
    if not seconds <= MAX_SECONDS:  # so written that an overflow to inf is refused too
        raise ValueError("more than a year: give at most 365d")
    return seconds


def format_duration(seconds: float) -> str:
    """A short human form: 45s, 12m, 3h, 2d."""
    if seconds < 0:
        seconds = 0.0
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
