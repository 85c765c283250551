"""The whole look at the runtimes is bounded, asked in this process: runtimes that accept a
connection and never answer cost at most OBSERVE_DEADLINES call deadlines together, the ones
whose turn comes after that are not asked, and the view decides nothing."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.runtime.cri import CriLiveness
from reaper.runtime.liveness import OBSERVE_DEADLINES

TIMEOUT = 0.5


@pytest.fixture
def silent_runtimes(tmp_path: Path) -> Iterator[tuple[str, ...]]:
    """Sockets that accept every connection (the kernel's backlog) and never answer."""
    listeners = []
    try:
        for i in range(OBSERVE_DEADLINES + 2):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(tmp_path / f"silent-{i}.sock"))
            sock.listen(16)
            listeners.append(sock)
        yield tuple(f"unix://{tmp_path}/silent-{i}.sock" for i in range(len(listeners)))
    finally:
        for sock in listeners:
            sock.close()


def test_runtimes_that_never_answer_cost_at_most_the_whole_deadline(silent_runtimes: tuple[str, ...]) -> None:
    started = time.monotonic()
    view = CriLiveness(silent_runtimes, TIMEOUT).observe({})
    took = time.monotonic() - started
    assert not view.reachable and view.sandboxes == ()
    assert took < OBSERVE_DEADLINES * TIMEOUT + 1.0, took
    not_asked = [a for a in view.runtimes if a.error and "ran out" in a.error]
    assert not_asked, [a.error for a in view.runtimes]
