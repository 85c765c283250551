"""A clock for tests of code that takes one (`clock=`): it moves only when the test says."""

from __future__ import annotations

import threading


class ManualClock:
    """Seconds that move only by `advance`, and by `tick` at each read when one is given (every
    read then later than the one before). It keeps what each thread read last: the value that
    thread's latest decision on the clock was made against."""

    def __init__(self, start: float = 100.0, tick: float = 0.0) -> None:
        self._now = start
        self._tick = tick
        self._lock = threading.Lock()
        self._last_read: dict[int, float] = {}

    def __call__(self) -> float:
        with self._lock:
            now = self._now
            self._now += self._tick
            self._last_read[threading.get_ident()] = now
            return now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def last_read(self) -> float | None:
        """What the calling thread read last (None: it never read the clock)."""
        with self._lock:
            return self._last_read.get(threading.get_ident())
