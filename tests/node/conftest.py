"""The lab every node test module shares: one fixture starts it and tears it down (its containerd,
its dirs, its netns and network), and small fixtures add what a module needs to it.

A module that needs more of the lab builds on these (`pytestmark = pytest.mark.usefixtures(...)`,
or a fixture of its own that takes `lab`) rather than starting a lab of its own."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.harness.lab import Lab
from tests.harness.reap_helpers import reproduce_both_seeds


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """The module's lab, fresh: a containerd of its own, Debian's CNI plugins and a private
    netns; stopped and removed (its pods, pins, mounts, dirs) when the module's tests are done."""
    with Lab() as made:
        yield made


@pytest.fixture(scope="module")
def web(lab: Lab) -> str:
    """A live pod "web" in the module's lab: its sandbox ID."""
    return lab.run_pod("web")


@pytest.fixture(scope="module")
def seeds(lab: Lab, web: str) -> tuple[str, str]:
    """Both seed reports beside the live pod `web` (started first): the sandbox of a chained
    list whose last plugin failed ADD and the one started while CNI was not configured, both
    NOTREADY with nothing running inside. Their sandbox IDs."""
    return reproduce_both_seeds(lab)


@pytest.fixture(scope="module")
def new_lab() -> Iterator[Callable[[], Lab]]:
    """Another lab beside the module's (a decoy runtime, a world a module changes for good):
    each call starts one; all are torn down, the last first, when the module's tests are done."""
    with contextlib.ExitStack() as labs:
        yield lambda: labs.enter_context(Lab())
