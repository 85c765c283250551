"""Where a pass's time goes: named laps, in order."""

from __future__ import annotations

import time

DIGITS = 6  # microseconds are plenty for a report


class Stopwatch:
    def __init__(self) -> None:
        self.laps: list[tuple[str, float]] = []
        self._last = time.perf_counter()

    def restart(self) -> None:
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, round(now - self._last, DIGITS)))
        self._last = now
