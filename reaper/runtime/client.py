"""A small typed client for the CRI v1 RuntimeService over a unix socket: the read-only calls
the reaper makes (Version, ListPodSandbox, PodSandboxStatus), their messages written and read
by reaper.runtime.wire."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc

from reaper.runtime import wire

_SERVICE = "/runtime.v1.RuntimeService/"
# The most a runtime's answer may be: grpc refuses a longer message from its length prefix,
# before it is taken in, so what a runtime sends costs a bounded amount of memory. 10,000 real
# sandboxes list in about 3 MB.
MAX_ANSWER = 16 * 1024 * 1024
# The most sandboxes one runtime may list: tiny items cost many times their wire size decoded.
MAX_SANDBOXES = 100_000
# The most one PodSandboxStatus answer may be (grpc's default; a verbose answer, the sandbox's
# whole OCI spec included, is tens of KB), several of them in flight at once.
MAX_STATUS_ANSWER = 4 * 1024 * 1024

T = TypeVar("T")


class CriError(Exception):
    """A CRI call failed; the message is one line fit for an operator."""


def _describe(err: grpc.RpcError) -> str:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else None
    name = code.name if code is not None else "UNKNOWN"
    text = (details or "").splitlines()[0] if details else ""
    return f"{name}: {text}" if text else name


class RuntimeClient:
    """One gRPC channel to a CRI runtime. Every call has a deadline. `target`: what to connect
    to when it is not the endpoint's path (the socket discovery checked, /proc/self/fd/N).
    `deadline` (time.monotonic()): no call runs past it, whatever `timeout` leaves."""

    def __init__(self, endpoint: str, timeout: float, target: str | None = None, deadline: float | None = None) -> None:
        if not endpoint.startswith("unix://") or not (target or endpoint).startswith("unix://"):
            raise CriError(f"runtime endpoint {endpoint!r} must be unix:///path/to/socket")
        self.endpoint = endpoint
        self.timeout = timeout
        self.deadline = deadline
        self._target = target or endpoint
        self._channel = self._open(MAX_ANSWER)
        self._status_channel: grpc.Channel | None = None  # opened for the first status batch

    def _open(self, most: int) -> grpc.Channel:
        """A channel whose answers grpc refuses past `most` bytes, from their length prefix."""
        return grpc.insecure_channel(
            self._target,
            options=[
                ("grpc.max_receive_message_length", most),
                ("grpc.enable_retries", 0),
                # A connection of this channel's own: grpc shares subchannels between channels
                # by address, and /proc/self/fd/N names another socket once N is reused.
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )

    def close(self) -> None:
        self._channel.close()
        if self._status_channel is not None:
            self._status_channel.close()

    def _left(self) -> float:
        if self.deadline is None:
            return self.timeout
        return max(min(self.timeout, self.deadline - time.monotonic()), 0.0)

    def __enter__(self) -> RuntimeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: bytes) -> bytes:
        """One RuntimeService call: the request's bytes in, the answer's bytes out."""
        # No serializers: the request goes as its bytes, and the answer comes back as its bytes.
        stub: Callable[..., bytes] = self._channel.unary_unary(
            _SERVICE + method, request_serializer=None, response_deserializer=None
        )
        try:
            return stub(request, timeout=self._left(), wait_for_ready=False)
        except grpc.RpcError as err:
            raise CriError(f"{method} on {self.endpoint}: {_describe(err)}") from None

    def _read(self, method: str, request: bytes, decode: Callable[[bytes], T]) -> T:
        answer = self.call(method, request)
        try:
            return decode(answer)
        except wire.WireError as err:
            raise CriError(f"{method} on {self.endpoint}: an answer that is no {method}Response: {err}") from None

    def version(self) -> wire.Version:
        return self._read("Version", wire.version_request(), wire.version)

    def list_pod_sandboxes(self) -> list[wire.PodSandbox]:
        answer = self.call("ListPodSandbox", wire.list_pod_sandbox_request())
        try:
            return wire.pod_sandboxes(answer, MAX_SANDBOXES)
        except wire.TooMany as err:
            raise CriError(f"ListPodSandbox on {self.endpoint}: {err}") from None
        except wire.WireError as err:
            raise CriError(
                f"ListPodSandbox on {self.endpoint}: an answer that is no ListPodSandboxResponse: {err}"
            ) from None

    def pod_sandbox_status(self, sandbox_id: str, verbose: bool = True) -> wire.PodSandboxStatus:
        request = wire.pod_sandbox_status_request(sandbox_id, verbose)
        return self._read("PodSandboxStatus", request, wire.pod_sandbox_status)

    def pod_sandbox_statuses(
        self,
        sandbox_ids: Sequence[str],
        keep: Callable[[wire.PodSandboxStatus | None], T],
        *,
        in_flight: int,
        deadline: float,
    ) -> dict[str, T]:
        """What `keep` takes of each sandbox's PodSandboxStatus(verbose), called as each answer
        comes (an answer is not held whole past it): None for a sandbox removed since it was
        listed (NOT_FOUND). At most `in_flight` asked at once, each answer at most
        MAX_STATUS_ANSWER, all answered by `deadline` (time.monotonic(); the client's own, when
        sooner). CriError at the first other failure, the rest cancelled."""
        if self._status_channel is None:
            self._status_channel = self._open(MAX_STATUS_ANSWER)
        stub = self._status_channel.unary_unary(
            _SERVICE + "PodSandboxStatus", request_serializer=None, response_deserializer=None
        )
        asked: deque[tuple[str, grpc.Future]] = deque()  # type: ignore[type-arg]
        out: dict[str, T] = {}
        todo = iter(sandbox_ids)
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)
        try:
            while True:
                for sandbox_id in todo:
                    request = wire.pod_sandbox_status_request(sandbox_id, True)
                    left = max(deadline - time.monotonic(), 0.0)
                    asked.append((sandbox_id, stub.future(request, timeout=left, wait_for_ready=False)))
                    if len(asked) >= in_flight:
                        break
                if not asked:
                    return out
                sandbox_id, future = asked.popleft()
                out[sandbox_id] = keep(self._status_of(future))
        finally:
            for _, future in asked:
                future.cancel()

    def _status_of(self, future: grpc.Future) -> wire.PodSandboxStatus | None:  # type: ignore[type-arg]
        try:
            answer: bytes = future.result()
        except grpc.RpcError as err:
            if isinstance(err, grpc.Call) and err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise CriError(f"PodSandboxStatus on {self.endpoint}: {_describe(err)}") from None
        except grpc.FutureCancelledError:
            raise CriError(f"PodSandboxStatus on {self.endpoint}: cancelled") from None
        try:
            return wire.pod_sandbox_status(answer)
        except wire.WireError as err:
            raise CriError(
                f"PodSandboxStatus on {self.endpoint}: an answer that is no PodSandboxStatusResponse: {err}"
            ) from None
