"""The CRI client in a process of its own, for one-shot commands.

grpc and protobuf cost a one-shot 0.1 s to import, a third of its start at 250 pods (`python
-X importtime`). Forked before the pass starts, a child imports them on another core while the
parent looks at the node, and the parent never imports them. The child asks the runtimes only
when the parent sends it a request, so the node is still looked at before the runtimes are
asked; it answers each request in turn until the parent closes its end. Requests from several
threads wait for each other (one socket, one answer at a time).

Fail closed: a child that died, hung up or answered something that is no view gives a view
with `reachable=False`, so nothing is called orphan. The parent kills and reaps the child by
its own pid on the way out, whatever happened.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import NoReturn

import msgspec

from reaper.model import RuntimeView
from reaper.runtime.liveness import LivenessSource

_LENGTH = struct.Struct(">I")
MAX_MESSAGE = 256 * 1024 * 1024  # a view of 10,000 sandboxes is about 3 MB

_encode = msgspec.msgpack.Encoder().encode
_decode_view = msgspec.msgpack.Decoder(RuntimeView).decode
_decode_request = msgspec.msgpack.Decoder(dict[str, str]).decode


class WorkerGone(Exception):
    """The other end hung up, or sent what is no message."""


def _send(sock: socket.socket, payload: bytes) -> None:
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


def _receive(sock: socket.socket) -> bytes:
    (size,) = _LENGTH.unpack(_receive_exactly(sock, _LENGTH.size))
    if size > MAX_MESSAGE:
        raise WorkerGone(f"a message of {size} bytes")
    return _receive_exactly(sock, size)


def ask(sock: socket.socket, known_netns: Mapping[str, str]) -> RuntimeView:
    """One request and its answer. WorkerGone, OSError or msgspec.DecodeError when the other
    end hung up or answered with anything but a view."""
    _send(sock, _encode(dict(known_netns)))
    return _decode_view(_receive(sock))


def unreachable(why: str) -> RuntimeView:
    return RuntimeView("", None, None, False, why, ())


class ForkedLiveness:
    """A LivenessSource answered by a forked child. Fork it before the process starts any
    thread (a child of a threaded process may inherit a lock some thread held). When the node
    lets no process be forked, the runtimes are asked from this process."""

    def __init__(self, endpoints: tuple[str, ...], timeout: float) -> None:
        self.pid: int | None = None
        self._in_process: LivenessSource | None = None
        self._turn = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = os.fork()
        except OSError:  # out of processes (EAGAIN) or memory
            ours.close()
            theirs.close()
            from reaper.runtime.cri import CriLiveness  # noqa: PLC0415

            self._in_process = CriLiveness(endpoints, timeout)
            return
        if pid == 0:  # pragma: no cover (the child; its work is tested through the parent)
            ours.close()
            _serve(theirs, endpoints, timeout)
        theirs.close()
        self.pid = pid
        self._sock = ours

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        if self._in_process is not None:
            return self._in_process.observe(known_netns)
        try:
            with self._turn:
                return ask(self._sock, known_netns)
        except (OSError, WorkerGone, msgspec.DecodeError) as err:
            return unreachable(f"the CRI client process (pid {self.pid}) gave no answer: {err}")

    def close(self) -> None:
        """Hang up, then kill and reap the child: whatever it is doing is a read-only call
        whose answer nobody will read. Not yet reaped, its pid cannot be anyone else's; once
        reaped it is forgotten, so a second close signals no one."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        self._sock.close()
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def __enter__(self) -> ForkedLiveness:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _serve(sock: socket.socket, endpoints: tuple[str, ...], timeout: float) -> NoReturn:
    """The child: import the CRI client, then answer every request until the parent hangs up.
    Never returns: os._exit, so nothing the parent had buffered or registered runs twice."""
    code = 0
    try:
        # Ctrl-C reaches the whole process group: the parent handles it and kills this child.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Not a holder of the report's pipe (`reaper scan | jq` ends when the parent does).
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        from reaper.runtime.cri import CriLiveness  # noqa: PLC0415 (the import this process exists for)

        liveness = CriLiveness(endpoints, timeout)
        while True:
            try:
                request = _receive(sock)
            except WorkerGone:
                break
            known = _decode_request(request)
            try:
                view = liveness.observe(known)
            except Exception as err:  # a bug in the client: the parent gets a view that decides nothing
                view = unreachable(f"the CRI client failed: {type(err).__name__}: {err}")
            _send(sock, _encode(view))
    except BaseException:  # the parent sees the hang-up and says so
        code = 1
    finally:
        os._exit(code)
