"""Hypothesis strategies the parser tests share: JSON of every shape, names an attacker picks."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# JSON values of every shape, nested a little.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
hostile_names = st.sampled_from(
    ["../../etc/passwd", "a/b", "a b", "a\nb", "..", ".", "", "-x", "x" * 2000, "é", "ok-name.v1", "\x00", "a;b=c"]
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
