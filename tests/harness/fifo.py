"""A FIFO that tells whether anything opened it, and never makes an open of it wait for ever.

A writer on a thread of its own waits in open() for a reader: a reader's blocking open then
returns at once instead of waiting for a writer that never comes (it reads the end of the file),
and the writer's open returning says a reader came. So a test that the code never waits on a
FIFO fails (`opened` is set) rather than hangs, whatever the machine's speed. An open that does
not wait (O_NONBLOCK) made before the writer is in its own may go unseen: it did not wait either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class WatchedFifo:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader_came = threading.Event()  # the writer's open returned: something opened the FIFO to read
        self.thread = threading.Thread(target=self._write, name="fifo-writer", daemon=True)

    def opened(self) -> bool:
        """Whether anything has opened the FIFO to read it so far."""
        return self.reader_came.is_set()

    def _write(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)  # waits for a reader
        self.reader_came.set()
        os.close(fd)  # the reader sees the end of the file

    def release(self) -> None:
        """Open the FIFO to read, so the writer's open returns, and wait for the writer to end. The
        read end stays open until then, so a writer not yet in its open finds it there."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self.thread.join(timeout=10)
        finally:
            os.close(fd)


@contextmanager
def watched_fifo(path: Path) -> Iterator[WatchedFifo]:
    """A FIFO made at `path` with its writer waiting; the writer is let go when the block ends.
    Ask `opened()` inside the block: letting the writer go opens the FIFO too."""
    os.mkfifo(path)
    fifo = WatchedFifo(path)
    fifo.thread.start()
    try:
        yield fifo
    finally:
        fifo.release()


def raised_unless_it_waits(path: Path, call: Callable[[], object], limit: float = 60.0) -> BaseException | None:
    """What `call` raised (None if it returned), run on a thread while nothing writes to the file at
    `path` (a FIFO without a writer, or a file of another type). A call that opens such a FIFO to
    wait for a writer would never end: one still running after `limit` seconds (a bound on a wait,
    not a speed: far beyond a slow machine's) is let go by a writer, and fails the test instead
    of hanging it."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as err:  # handed to the test, which judges it
            raised.append(err)

    worker = threading.Thread(target=run, name="fifo-reader", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a reader is waiting in it
        os.close(fd)
        worker.join(10)
        raise AssertionError(f"still waiting on the FIFO {path} after {limit:g}s")
    return raised[0] if raised else None
