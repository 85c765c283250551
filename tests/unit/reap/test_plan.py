"""The plan of a reclaiming pass: the breaker, --max-reap, the re-check's reasons."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reaper.reap.plan import breaker_trips


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 500), st.integers(0, 500), st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 1.0]))
def test_the_breaker_opens_exactly_above_the_ratio(orphans: int, live: int, ratio: float) -> None:
    total = orphans + live
    assert breaker_trips(orphans, total, ratio) == (total > 0 and orphans * 1.0 / total > ratio)
    if total and orphans <= ratio * total:
        assert not breaker_trips(orphans, total, ratio)
