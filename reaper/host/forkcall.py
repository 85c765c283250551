"""One call answered by a forked child, and the wire both forked helpers speak.

A one-shot pass is Python work on one core while the node has two or more: a call that reads
and decodes on its own (the link dump: the kernel's answer and 2,500 links decoded) runs in a
child forked at the start of the look, on another core, while the parent reads the files. The
parent reads the answer when it needs it.

Messages are a 4-byte big-endian length, then that many bytes (msgspec msgpack); a length
over MAX_MESSAGE is never waited for. Fork only from a process with no other thread running
(a child of a threaded process may inherit a lock some thread held): the agent, whose
scheduler and HTTP server run threads, calls in-process.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import Generic, NoReturn, Self, TypeVar

import msgspec

T = TypeVar("T")

_LENGTH = struct.Struct(">I")
MAX_MESSAGE = 256 * 1024 * 1024  # a view of 10,000 sandboxes is about 3 MB, 10,000 links 0.5 MB
ANSWER_TIMEOUT = 120.0  # seconds a call's answer may take (the link dump's own reads time out at 30)
_OK, _FAILED = b"\x00", b"\x01"


class WorkerGone(Exception):
    """The other end hung up, or sent what is no message."""


def send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise WorkerGone("hung up")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> bytes:
    (size,) = _LENGTH.unpack(_receive_exactly(sock, _LENGTH.size))
    if size > MAX_MESSAGE:
        raise WorkerGone(f"a message of {size} bytes")
    return _receive_exactly(sock, size)


def detach_from_terminal() -> None:
    """In a forked child: Ctrl-C reaches the whole process group, and the parent handles it
    (and kills this child); the report's pipe is not held (`reaper scan | jq` ends when the
    parent does). Other descriptors are left open: the parent's objects that own them live on
    in the child, and one closed behind them could close a descriptor the child opened since.
    A child that outlives its parent ends at its next send (EPIPE) or read (EOF)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class Child:
    """A child forked now that runs `serve` on its end of a socket pair and never returns; this
    process keeps the other end. `pid` is None when the node forked none (EAGAIN, no memory)
    and once the child is closed."""

    def __init__(self, serve: Callable[[socket.socket], NoReturn]) -> None:
        self.pid: int | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = os.fork()
        except OSError:  # out of processes or memory
            ours.close()
            theirs.close()
            return
        if pid == 0:  # pragma: no cover (the child; its work is tested through the parent)
            ours.close()
            serve(theirs)
        theirs.close()
        self.pid = pid
        self._sock = ours

    def close(self) -> None:
        """Hang up, then kill and reap the child: whatever it is doing is read-only work whose
        answer nobody will read. Not yet reaped, its pid cannot be anyone else's; once reaped it
        is forgotten, so a second close signals no one."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        self._sock.close()
        kill_and_reap(pid)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class ForkedCall(Child, Generic[T]):
    """`call()`'s answer, computed in a child forked now; `result()` waits for it. Told not to
    fork (a process with other threads), or on a node that forks no process, `result()` makes
    the call in this process."""

    def __init__(
        self, call: Callable[[], T], answer_type: type[T], timeout: float = ANSWER_TIMEOUT, fork: bool = True
    ) -> None:
        self._call: Callable[[], T] | None = None
        self._decode = msgspec.msgpack.Decoder(answer_type).decode
        if fork:
            super().__init__(partial(_answer, call=call))
        else:
            self.pid = None
        if self.pid is None:
            self._call = call
        else:
            self._sock.settimeout(timeout)

    def result(self) -> T:
        """The call's answer; OSError, with what went wrong, when the call raised one or the
        child died, hung up, timed out or sent anything but an answer of the type."""
        if self._call is not None:
            return self._call()
        try:
            message = receive(self._sock)
            if message[:1] == _FAILED:
                raise OSError(message[1:].decode("utf-8", "replace")[:500])
            if message[:1] != _OK:
                raise WorkerGone("an answer neither failed nor done")
            return self._decode(message[1:])
        except (WorkerGone, msgspec.DecodeError) as err:
            raise OSError(f"the forked call (pid {self.pid}) gave no answer: {err}") from None
        finally:
            self.close()


def _answer(sock: socket.socket, call: Callable[[], T]) -> NoReturn:
    """The child: make the call, send its answer or its error, exit. os._exit, so nothing the
    parent had buffered or registered runs twice."""
    code = 0
    try:
        detach_from_terminal()
        try:
            message = _OK + msgspec.msgpack.encode(call())
        except Exception as err:  # the parent raises it as an OSError, and the kind reports it
            message = _FAILED + str(err).encode("utf-8", "replace")
        send(sock, message)
    except BaseException:  # the parent sees the hang-up and says so
        code = 1
    finally:
        os._exit(code)
