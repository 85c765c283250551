"""A small typed client for the CRI v1 RuntimeService over a unix socket: the read-only calls
the reaper makes (Version, ListPodSandbox, PodSandboxStatus), their messages written and read
by protobuf (reaper/runtime/api.proto: the fields the reaper sends and reads; a runtime's
other fields are skipped as unknown)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from reaper.runtime import api_pb2 as pb

_SERVICE = "/runtime.v1.RuntimeService/"
# The most a runtime's answer may be: grpc refuses a longer message from its length prefix,
# before it is taken in, so what a runtime sends costs a bounded amount of memory. 10,000 real
# sandboxes list in about 3 MB.
MAX_ANSWER = 16 * 1024 * 1024
# The most sandboxes one runtime may list: tiny items cost many times their wire size decoded,
# so they are counted on the wire before protobuf decodes the list whole.
MAX_SANDBOXES = 100_000
# The most one PodSandboxStatus answer may be (grpc's default; a verbose answer, the sandbox's
# whole OCI spec included, is tens of KB), several of them in flight at once.
MAX_STATUS_ANSWER = 4 * 1024 * 1024

T = TypeVar("T")
M = TypeVar("M", bound=Message)


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
    """The answer to `method` as protobuf reads it; what protobuf refuses (cut short, a string
    that is no UTF-8, ...) is that runtime's error, one line."""
    try:
        return message.FromString(answer)
    except DecodeError as err:
        why = str(err).splitlines()[0] if str(err) else "undecodable"
        raise CriError(f"{method} on {endpoint}: an answer that is no {method}Response: {why}") from None


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and where what follows it starts; ValueError past ten bytes or the
    end (bytes protobuf refuses too)."""
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
    more than twice as many fields of any kind at its top level (a runtime sends items there and
    little else); None when it is not. Counted on the wire before protobuf decodes the list
    whole: an empty item, two bytes on the wire, takes about thirty times that decoded, so 16 MiB
    of them would take the agent past its memory limit. Only the top level is walked (each
    field's tag, its value skipped, a group's fields not counted as items), and only until a
    count is passed. What it cannot walk, protobuf refuses too: it leaves that to protobuf."""
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
