"""The CRI client in a process of its own, for one-shot commands.

grpc costs a one-shot 0.1 s to import, a third of its start at 250 pods (`python -X
importtime`). Forked before the pass starts, a child imports it on another core while the
parent looks at the node, and the parent never imports it. The child asks the runtimes only
when the parent sends it a request, so the node is still looked at before the runtimes are
asked; it answers each request in turn until the parent closes its end. Requests from several
threads wait for each other (one socket, one answer at a time).

Fail closed: a child that died, hung up, answered something that is no view, or did not answer
by its deadline gives a view with `reachable=False`, so nothing is called orphan. The deadline
is what the child's own asking is bounded by (OBSERVE_DEADLINES call deadlines) and a margin
for its discovery and its start; a child past it is killed, and every later request is
answered with no view. The parent kills and reaps the child by
its own pid on the way out, whatever happened.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import NoReturn

import msgspec

from reaper.host.forkcall import MAX_MESSAGE, Child, WorkerGone, detach_from_terminal, receive, send
from reaper.model import RuntimeView
from reaper.runtime.liveness import OBSERVE_DEADLINES, LivenessSource

__all__ = ["MAX_MESSAGE", "ForkedLiveness", "WorkerGone", "read_view", "send_request", "unreachable"]


class Request(msgspec.Struct, frozen=True):
    """What the parent asks: the runtimes (sent with every request, so that the child can be
    forked, and import the client, before the parent has read its settings), the client's
    timeout, and the netns paths PodSandboxStatus gave before."""

    endpoints: tuple[str, ...]
    timeout: float
    known_netns: dict[str, str]


_encode = msgspec.msgpack.Encoder().encode
_decode_view = msgspec.msgpack.Decoder(RuntimeView).decode
_decode_request = msgspec.msgpack.Decoder(Request).decode


def send_request(sock: socket.socket, request: Request) -> None:
    send(sock, _encode(request))


def read_view(sock: socket.socket) -> RuntimeView:
    """The answer to a request. WorkerGone, OSError or msgspec.DecodeError when the other end
    hung up or answered with anything but a view."""
    return _decode_view(receive(sock))


# What a request may take beyond the child's calls: discovery, decoding, and grpc's import when
# the first request comes right after the fork.
MARGIN = 30.0


def unreachable(why: str) -> RuntimeView:
    return RuntimeView("", None, None, False, why, ())


class ForkedLiveness(Child):
    """A LivenessSource answered by a forked child. Fork it before the process starts any
    thread (a child of a threaded process may inherit a lock some thread held), and as early
    as may be: the child imports the client at once, and learns which runtimes to ask with
    each request (aim() them first). When the node lets no process be forked, the runtimes are
    asked from this process."""

    def __init__(self, endpoints: tuple[str, ...] = (), timeout: float = 0.0, margin: float = MARGIN) -> None:
        self._in_process: LivenessSource | None = None
        self._margin = margin
        self._turn = threading.Lock()
        self.aim(endpoints, timeout)
        super().__init__(_serve)
        self._forked = self.pid is not None

    def aim(self, endpoints: tuple[str, ...], timeout: float) -> None:
        """The runtimes every later observe() asks, and the client's timeout."""
        self._endpoints, self._timeout = endpoints, timeout
        self._in_process = None

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        return self.ask(known_netns)()

    def ask(self, known_netns: Mapping[str, str]) -> Callable[[], RuntimeView]:
        """The request sent now; the call returned reads the child's answer (another thread's
        request waits until it has)."""
        if not self._forked:
            if self._in_process is None:
                from reaper.runtime.cri import CriLiveness  # noqa: PLC0415

                self._in_process = CriLiveness(self._endpoints, self._timeout)
            return partial(self._in_process.observe, known_netns)
        self._turn.acquire()
        try:
            self._sock.settimeout(OBSERVE_DEADLINES * self._timeout + self._margin)
            send_request(self._sock, Request(self._endpoints, self._timeout, dict(known_netns)))
        except OSError as err:
            self._turn.release()
            return partial(self._no_answer, err)
        return self._answer

    def _answer(self) -> RuntimeView:
        try:
            return read_view(self._sock)
        except TimeoutError:
            # A late answer would be read as the next request's: the child goes, and every
            # later request gets no view.
            pid = self.pid
            self.close()
            return unreachable(f"the CRI client process (pid {pid}) gave no answer by its deadline")
        except (OSError, WorkerGone, msgspec.DecodeError) as err:
            return self._no_answer(err)
        finally:
            self._turn.release()

    def _no_answer(self, err: Exception) -> RuntimeView:
        return unreachable(f"the CRI client process (pid {self.pid}) gave no answer: {err}")


def _serve(sock: socket.socket) -> NoReturn:
    """The child: import the CRI client, then answer every request until the parent hangs up
    (one client for each set of runtimes asked). Never returns: os._exit, so nothing the
    parent had buffered or registered runs twice."""
    code = 0
    try:
        detach_from_terminal()
        from reaper.runtime.cri import CriLiveness  # noqa: PLC0415 (the import this process exists for)

        clients: dict[tuple[tuple[str, ...], float], CriLiveness] = {}
        while True:
            try:
                request = _decode_request(receive(sock))
            except WorkerGone:
                break
            aimed = (request.endpoints, request.timeout)
            try:
                liveness = clients.get(aimed)
                if liveness is None:
                    liveness = clients[aimed] = CriLiveness(*aimed)
                view = liveness.observe(request.known_netns)
            except Exception as err:  # a bug in the client: the parent gets a view that decides nothing
                view = unreachable(f"the CRI client failed: {type(err).__name__}: {err}")
            send(sock, _encode(view))
    except BaseException:  # the parent sees the hang-up and says so
        code = 1
    finally:
        os._exit(code)
