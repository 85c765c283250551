"""Durations given on the command line or in the environment, and durations as reports show them.

A duration is seconds (`90`, `1.5`) or numbers with a unit as Go's time.ParseDuration reads them
(`10m`, `1h30m`, `250ms`), plus `d`; no sign, `ns` or `us`. Every duration is at most a year
(MAX_SECONDS), bounded here in its one parser: longer ones broke where they were used
(docs/design.md, "Durations").
"""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"\d+(?:\.\d+)?"
# `ms` before `m`, so `250ms` is one part and not 250 minutes followed by junk.
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)")
_COMPOUND = re.compile(rf"(?:{_NUMBER}(?:ms|s|m|h|d))+")
_BARE = re.compile(_NUMBER)

# The longest duration any setting takes (tests/unit/test_durations.py: the places that use
# one take it).
MAX_SECONDS = 365 * 86400.0

# What --help and the errors say is accepted, in one place.
ACCEPTED = "seconds (90) or numbers with a unit ms, s, m, h or d, one or more (10m, 1h30m, 1.5h), at most 365d"


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError saying what is wrong (the caller names the setting)."""
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
    seconds = max(seconds, 0.0)
    for below, size, unit in ((120, 1, "s"), (7200, 60, "m"), (172800, 3600, "h")):
        if seconds < below:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds / 86400:.0f}d"
