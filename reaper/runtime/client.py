"""A small typed client for the CRI v1 RuntimeService over a unix socket: the read-only calls
the reaper makes (Version, ListPodSandbox, PodSandboxStatus)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from reaper.runtime import api_pb2 as pb

_SERVICE = "/runtime.v1.RuntimeService/"

Resp = TypeVar("Resp", bound=Message)


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

    def _call(self, method: str, request: Message, response_type: type[Resp]) -> Resp:
        stub: Callable[..., Any] = self._channel.unary_unary(
            _SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        try:
            result: Resp = stub(request, timeout=self.timeout, wait_for_ready=False)
        except grpc.RpcError as err:
            raise CriError(f"{method} on {self.endpoint}: {_describe(err)}") from None
        return result

    def version(self) -> pb.VersionResponse:
        return self._call("Version", pb.VersionRequest(version="v1"), pb.VersionResponse)

    def list_pod_sandboxes(self) -> list[pb.PodSandbox]:
        resp = self._call("ListPodSandbox", pb.ListPodSandboxRequest(), pb.ListPodSandboxResponse)
        return list(resp.items)

    def pod_sandbox_status(self, sandbox_id: str, verbose: bool = True) -> pb.PodSandboxStatusResponse:
        req = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose)
        return self._call("PodSandboxStatus", req, pb.PodSandboxStatusResponse)
