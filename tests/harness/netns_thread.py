"""Work done from inside another process's network namespace, by a thread of its own."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def in_netns(pid: int, work: Callable[[], T]) -> T:
    """`work()` on a thread of its own that joined the network namespace of `pid`; a socket made
    there keeps that namespace whichever thread uses it later."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns: {os.strerror(code)}")
            finally:
                os.close(fd)
            result.append(work())
        except BaseException as err:
            failure.append(err)

    thread = threading.Thread(target=run, name="netns")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
