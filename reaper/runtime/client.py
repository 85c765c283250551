"""A typed client for the CRI v1 RuntimeService over a unix socket: the read-only calls the
reaper makes (Version, ListPodSandbox, PodSandboxStatus), as protobuf (api.proto); every answer
bounded. Why the bounds: docs/design.md, "Finding the CRI runtimes"."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from reaper.runtime import api_pb2 as pb

_SERVICE = "/runtime.v1.RuntimeService/"
# A runtime's answer at most: grpc refuses a longer one from its length prefix, before taking it in.
MAX_ANSWER = 16 * 1024 * 1024
MAX_SANDBOXES = 100_000  # counted on the wire: tiny items cost many times their size decoded
# One PodSandboxStatus answer at most (grpc's default; a verbose one is tens of KB).
MAX_STATUS_ANSWER = 4 * 1024 * 1024

T = TypeVar("T")
M = TypeVar("M", bound=Message)


class CriError(Exception):
    """A CRI call failed; the message is one line fit for an operator."""


def _describe(err: grpc.RpcError) -> str:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else None
    name = code.name if code is not None else "UNKNOWN"
    text = details.splitlines()[0] if details else ""
    return f"{name}: {text}" if text else name


class RuntimeClient:
    """One gRPC channel to a CRI runtime, every call with a deadline. `target`: what to connect
    to (/proc/self/fd/N, the socket discovery checked); no call runs past `deadline` (monotonic)."""

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
                # grpc shares subchannels by address; /proc/self/fd/N names another socket once N is reused.
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
        stub: Callable[..., bytes] = self._channel.unary_unary(
            _SERVICE + method, request_serializer=None, response_deserializer=None
        )
        try:
            return stub(request, timeout=self._left(), wait_for_ready=False)
        except grpc.RpcError as err:
            raise CriError(f"{method} on {self.endpoint}: {_describe(err)}") from None

    def _read(self, method: str, request: Message, answer: type[M]) -> M:
        return _decoded(self.endpoint, method, answer, self.call(method, request.SerializeToString()))

    def version(self) -> pb.VersionResponse:
        return self._read("Version", pb.VersionRequest(version="v1"), pb.VersionResponse)

    def list_pod_sandboxes(self) -> list[pb.PodSandbox]:
        method = "ListPodSandbox"
        answer = self.call(method, pb.ListPodSandboxRequest().SerializeToString())
        too_long = _too_long(answer, MAX_SANDBOXES)
        if too_long is not None:
            raise CriError(f"{method} on {self.endpoint}: {too_long}")
        return list(_decoded(self.endpoint, method, pb.ListPodSandboxResponse, answer).items)

    def pod_sandbox_status(self, sandbox_id: str, verbose: bool = True) -> pb.PodSandboxStatusResponse:
        request = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose)
        return self._read("PodSandboxStatus", request, pb.PodSandboxStatusResponse)

    def pod_sandbox_statuses(
        self,
        sandbox_ids: Sequence[str],
        keep: Callable[[pb.PodSandboxStatusResponse | None], T],
        *,
        in_flight: int,
        deadline: float,
    ) -> dict[str, T]:
        """What `keep` takes of each sandbox's PodSandboxStatus(verbose) as it comes (None: removed
        since listed, NOT_FOUND). At most `in_flight` at once, each at most MAX_STATUS_ANSWER, all
        by `deadline` (or the client's own); CriError at the first other failure, the rest cancelled."""
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
                    request = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True).SerializeToString()
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

    def _status_of(self, future: grpc.Future) -> pb.PodSandboxStatusResponse | None:  # type: ignore[type-arg]
        try:
            answer: bytes = future.result()
        except grpc.RpcError as err:
            if isinstance(err, grpc.Call) and err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise CriError(f"PodSandboxStatus on {self.endpoint}: {_describe(err)}") from None
        except grpc.FutureCancelledError:
            raise CriError(f"PodSandboxStatus on {self.endpoint}: cancelled") from None
        return _decoded(self.endpoint, "PodSandboxStatus", pb.PodSandboxStatusResponse, answer)


def _decoded(endpoint: str, method: str, message: type[M], answer: bytes) -> M:
    """The answer to `method` as protobuf reads it; what protobuf refuses is the runtime's error."""
    try:
        return message.FromString(answer)
    except DecodeError as err:
        why = str(err).splitlines()[0] if str(err) else "undecodable"
        raise CriError(f"{method} on {endpoint}: an answer that is no {method}Response: {why}") from None


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and where what follows starts; ValueError past ten bytes or the end."""
    value = shift = 0
    for at in range(pos, min(pos + 10, len(buf))):
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at + 1
        shift += 7
    raise ValueError("a varint cut short or over ten bytes")


def _too_long(answer: bytes, most: int) -> str | None:
    """Why a ListPodSandboxResponse is too long to decode: more than `most` items (field 1), or
    more than twice as many top-level fields; else None. Only the top level is walked (a group's
    fields are not items); what it cannot walk, it leaves to protobuf, which refuses it too."""
    if len(answer) < 2 * (most + 1):  # every field takes two bytes at least
        return None
    items = fields = pos = depth = 0
    end = len(answer)
    try:
        while pos < end:
            fields += 1
            if fields > 2 * most:
                return f"more than {2 * most:,} fields"
            key, pos = _varint(answer, pos)
            kind = key & 7
            if kind == 0:
                _, pos = _varint(answer, pos)
            elif kind == 1:
                pos += 8
            elif kind == 5:
                pos += 4
            elif kind == 2:
                size, pos = _varint(answer, pos)
                pos += size
                if key >> 3 == 1 and depth == 0:
                    items += 1
                    if items > most:
                        return f"more than {most:,} sandboxes"
            elif kind == 3:  # a group's start: protobuf skips it, with all it holds
                depth += 1
            elif kind == 4 and depth > 0:
                depth -= 1
            else:
                return None
    except ValueError:
        return None
    return None
