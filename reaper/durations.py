"""Durations given on the command line or in the environment: `90`, `90s`, `10m`, `1h`, `1d`."""

from __future__ import annotations

import re

_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError with a readable message when it is not a duration."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (use seconds or a unit: 90, 90s, 10m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2) or ""]


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
