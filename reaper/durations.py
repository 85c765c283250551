"""Durations given on the command line or in the environment, and durations as reports show them.

A duration is a bare number of seconds (`90`, `1.5`), or one or more numbers each with a unit,
largest first or not, as Go's time.ParseDuration reads them (`90s`, `10m`, `1h30m`, `1.5h`,
`250ms`), with `d` for days besides. What Go takes beyond that (a sign, `ns` and `us`) is not
taken: no setting here wants a negative or sub-millisecond time, and saying so beats reading one.
"""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"\d+(?:\.\d+)?"
# `ms` before `m`, so `250ms` is one part and not 250 minutes followed by junk.
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)")
_COMPOUND = re.compile(rf"(?:{_NUMBER}(?:ms|s|m|h|d))+")
_BARE = re.compile(_NUMBER)

# What --help and the errors say is accepted, in one place.
ACCEPTED = "seconds (90) or numbers with a unit ms, s, m, h or d, one or more (10m, 1h30m, 1.5h)"


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
