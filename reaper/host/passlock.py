"""One reaper at a time per node: an flock on a file beside the state file, held for a pass.

Two reapers on one node (the agent and an operator's `kubectl exec ... reaper reap`, or the
systemd timer's one-shot beside an agent) would run the plugins' DEL for the same container at
once, which the CNI spec forbids the runtime the reaper stands in for ("The container runtime
must not invoke parallel operations for the same container": containernetworking/cni SPEC.md,
Lifecycle & Ordering), and each would save the state file over the other's. A pass that can change the node or the
state file (`reap`, `scan`, which counts confirmations there, and each of the agent's passes)
holds the lock from before its look until its state and textfile are written; the agent takes
it per pass and lets it go between, so an operator's one-shot runs between two of its passes.

The file is `<state file>.lock`, in the state dir (which only root writes, like the state file).
It is opened `O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK` through its directory's fd, created mode
0600, never truncated: a symlink there is refused, a FIFO does not block, the lock goes to no
child (a plugin that outlives its DEL holds nothing), and a file planted there (a hard link to
another file, another user's) is refused before a byte is written to it. The holder writes
one record at its start, `pid <pid>: <command>`, padded to a fixed size (so nothing is ever
truncated); a waiter reads it as untrusted text: a bounded read, printable characters only.
The lock is the kernel's flock, held by the open file: it goes with the process, however the
process ends, so a holder recorded is alive.
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
# A state dir this process cannot write: no pass of it can save its state there either.
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
    """The lock file's fd, made if missing; refused when it is not this user's own regular
    file with one name."""
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
    """The lock beside `state_file`, waited for at most `wait` seconds. `on_wait` is told the
    holder once, when the first try finds the lock held; `pause(seconds)` sleeps between tries
    and returns True to give up (a stopping agent). LockBusy when it stays held; LockUnusable
    when the file cannot be opened or trusted."""
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
            if pause is not None and pause(min(POLL, left)):  # told to give up before the end
                raise LockBusy(path, holder, round(time.monotonic() - started, 1))
            if pause is None:
                time.sleep(min(POLL, left))
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
    """The lock one pass holds, waited for at most `wait` seconds, the wait logged once with
    the holder. Where the state dir cannot be written by this process, a pass that changes
    nothing on the node (a scan as a user other than root) goes on without it: it can save no
    state there either. LockBusy, LockUnusable as take_lock."""
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
