"""One reaper at a time per node: an flock on `<state file>.lock`, held for a pass.

Two reapers would run parallel DELs for one container, which the CNI spec forbids, and save
the state file over each other's. The file is opened without following a symlink, created
0600, never truncated, and refused unless this user's own regular file with one name; the
holder's record is read as untrusted text. Why: docs/design.md, "The pass lock".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shlex
import stat
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self

from reaper.host.confined import open_root
from reaper.host.files import describe_oserror

LOCK_SUFFIX = ".lock"
RECORD_BYTES = 256  # the holder's record, padded to this size; a waiter reads no more
POLL = 0.1  # seconds between a waiter's tries
HOLDER_CHARS = 200  # of the record, as a waiter shows it
_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


class LockBusy(Exception):
    """Another reaper held the lock for the whole wait."""

    def __init__(self, path: str, holder: str, waited: float) -> None:
        super().__init__(f"another reaper holds {path} ({holder}); waited {waited:g}s, nothing done")
        self.holder = holder


class LockUnusable(Exception):
    """The lock file cannot be opened or is not one to trust; one line for the operator."""

    def __init__(self, path: str, why: str, *, read_only: bool = False) -> None:
        super().__init__(f"cannot take the lock {path}: {why}")
        self.read_only = read_only  # the state dir is not writable here (EACCES, EPERM, EROFS)


def lock_path(state_file: str) -> str:
    return os.path.abspath(state_file) + LOCK_SUFFIX


def holder_text(raw: bytes) -> str:
    """What a holder's record says, as one bounded line of printable characters."""
    text = raw[:RECORD_BYTES].decode("utf-8", errors="replace")
    shown = " ".join("".join(c if c.isprintable() else " " for c in text).split())[:HOLDER_CHARS]
    return shown or "a holder that left no record"


def _record(command: str) -> bytes:
    line = f"pid {os.getpid()}: {command}".encode(errors="replace")[: RECORD_BYTES - 1]
    return line.ljust(RECORD_BYTES - 1) + b"\n"


def _open(path: str) -> int:
    """The lock file's fd, made if missing; LockUnusable unless this user's own regular file with one name."""
    directory, name = os.path.split(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        dir_fd = open_root(directory)
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as err:
        why = "a symlink is there; remove it" if err.errno == errno.ELOOP else describe_oserror(err)
        raise LockUnusable(path, why, read_only=err.errno in _READ_ONLY) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        os.close(fd)
        raise LockUnusable(path, "not a regular file of this user's own with one name; remove it")
    return fd


class PassLock:
    """The lock, held until release() (or the end of a `with`)."""

    def __init__(self, path: str, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the flock goes with the last fd of the open file
            self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def take_lock(
    state_file: str,
    wait: float,
    command: str,
    *,
    on_wait: Callable[[str], None] | None = None,
    pause: Callable[[float], bool] | None = None,
) -> PassLock:
    """The lock beside `state_file`, waited for at most `wait` seconds (LockBusy). `on_wait` is
    told the holder once; `pause(seconds)` sleeps between tries and returns True to give up (a
    stopping agent). LockUnusable when the file cannot be opened or trusted."""
    path = lock_path(state_file)
    fd = _open(path)
    started = time.monotonic()
    deadline = started + wait
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            holder = holder_text(os.pread(fd, RECORD_BYTES, 0))
            left = deadline - time.monotonic()
            if left <= 0:
                raise LockBusy(path, holder, wait)
            if on_wait is not None and not told:
                on_wait(holder)
                told = True
            if pause is None:
                time.sleep(min(POLL, left))
            elif pause(min(POLL, left)):  # told to give up before the end
                raise LockBusy(path, holder, round(time.monotonic() - started, 1))
        # On a full disk the lock is held all the same, and a waiter is told of no record.
        with contextlib.suppress(OSError):
            os.pwrite(fd, _record(command), 0)
    except BaseException:
        os.close(fd)
        raise
    return PassLock(path, fd)


def command_line() -> str:
    """This process's command, as a waiting reaper is shown it."""
    return shlex.join(["reaper", *sys.argv[1:]])


def pass_lock(
    state_file: str,
    wait: float,
    log: logging.Logger,
    *,
    changes_node: bool,
    pause: Callable[[float], bool] | None = None,
) -> PassLock:
    """take_lock for one pass, the wait logged once with the holder. A pass that changes nothing
    on the node (a scan as a user other than root) goes on without it where the state dir is
    read-only to it: it can save no state there either."""
    try:
        return take_lock(
            state_file,
            wait,
            command_line(),
            on_wait=lambda holder: log.warning(
                "waiting for another reaper's pass", extra={"holder": holder, "lock_wait": wait}
            ),
            pause=pause,
        )
    except LockUnusable as err:
        if changes_node or not err.read_only:
            raise
        log.warning(f"{err}; going on without it (no state can be saved there either)")
        return PassLock(lock_path(state_file), None)
