"""The fake node the reclaim path's unit tests share (test_reap_pass.py has one that also
stands in for the pass's look)."""

from __future__ import annotations

import pytest

from tests.harness.reclaim_fakes import FakeNode, use_kinds


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    """A fake node whose kinds are the only ones the reclaim path knows."""
    fake = FakeNode()
    use_kinds(monkeypatch, fake.kinds)
    return fake
