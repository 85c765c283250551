"""A small typed client for the CRI v1 RuntimeService over a unix socket: the read-only calls
the reaper makes (Version, ListPodSandbox, PodSandboxStatus), their messages written and read
by reaper.runtime.wire."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

from reaper.runtime import wire

_SERVICE = "/runtime.v1.RuntimeService/"

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
    """One gRPC channel to a CRI runtime. Every call has a deadline."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        if not endpoint.startswith("unix://"):
            raise CriError(f"runtime endpoint {endpoint!r} must be unix:///path/to/socket")
        self.endpoint = endpoint
        self.timeout = timeout
        self._channel = grpc.insecure_channel(
            endpoint,
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.enable_retries", 0),
            ],
        )

    def close(self) -> None:
        self._channel.close()

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
            return stub(request, timeout=self.timeout, wait_for_ready=False)
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
        return self._read("ListPodSandbox", wire.list_pod_sandbox_request(), wire.pod_sandboxes)

    def pod_sandbox_status(self, sandbox_id: str, verbose: bool = True) -> wire.PodSandboxStatus:
        request = wire.pod_sandbox_status_request(sandbox_id, verbose)
        return self._read("PodSandboxStatus", request, wire.pod_sandbox_status)
