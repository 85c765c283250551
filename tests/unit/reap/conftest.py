"""The fake node the reclaim path's unit tests share (test_reap_pass.py has one that also
stands in for the pass's look)."""

from __future__ import annotations

import pytest

from tests.harness.reclaim_fakes import FakeNode


@pytest.fixture
def node() -> FakeNode:
    """A fake node, whose kinds (node.registry) the tests hand to the reclaim path."""
    return FakeNode()
