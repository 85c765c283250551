"""A lightkube client for the pod's service account (reaper.kubeapi), for the pod-CIDR lookup
(reaper.podcidr) and the Node's Events (reaper.events).

What it adds to lightkube: the server verified with the service account's CA alone, no proxy or
CA from the environment, every answer cut off past a size as it arrives, and one deadline for
each whole call (connect, TLS handshake, every read and write), not one per read; why:
docs/design.md, "In depth: the core, state and what is reported"."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore2 as httpcore
import httpx2 as httpx
import msgspec
from lightkube import Client, KubeConfig
from lightkube.config.models import Cluster, User

from reaper.kubeapi import API_TIMEOUT, ServiceAccount

MAX_ANSWER_BYTES = 1 << 20  # an Event or a Status is a few KB; a caller reading more says so


class AnswerTooLarge(Exception):
    """The server sent more than the caller allowed; the rest was not read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer larger than {max(1, limit >> 20)} MiB")
        self.limit = limit


class CallDeadline(httpx.TimeoutException):
    """The whole call took longer than its deadline; the connection was closed."""


class _Deadline:
    """What is left of one call's time, for each socket operation of it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self, timeout: float | None, expired: type[Exception]) -> float:
        """`timeout` cut to what is left; `expired` (an httpcore timeout) once nothing is."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise expired(f"the call's deadline of {self.seconds:g}s passed")
        return left if timeout is None else min(timeout, left)

    def passed(self) -> bool:
        return time.monotonic() >= self.at


@dataclass
class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write, and its TLS handshake, end by the deadline."""

    inner: httpcore.NetworkStream
    deadline: _Deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, self.deadline.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, self.deadline.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        left = self.deadline.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self.inner.start_tls(ssl_context, server_hostname, left), self.deadline)

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own sockets, each given what is left of one call's deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        self.inner = httpcore.SyncBackend()
        self.deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        left = self.deadline.left(timeout, httpcore.ConnectTimeout)
        stream = self.inner.connect_tcp(host, port, left, local_address, socket_options)
        return _DeadlineStream(stream, self.deadline)


def _mapped(err: Exception, request: httpx.Request, deadline: _Deadline) -> httpx.TransportError:
    """The httpx error for an httpcore one (their classes share names); CallDeadline once the call's deadline passed."""
    if isinstance(err, httpcore.TimeoutException) and deadline.passed():
        return CallDeadline(f"the call's deadline of {deadline.seconds:g}s passed", request=request)
    found = getattr(httpx, type(err).__name__, None)
    kind = found if isinstance(found, type) and issubclass(found, httpx.TransportError) else httpx.TransportError
    return kind(str(err) or type(err).__name__, request=request)


_HTTPCORE_FAILURES = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
)


@dataclass
class _BoundedStream(httpx.SyncByteStream):
    """A response body that stops with AnswerTooLarge once more than `limit` bytes came, read
    within the call's deadline; closing it closes the call's connection."""

    inner: Iterable[bytes]
    limit: int
    pool: httpcore.ConnectionPool
    request: httpx.Request
    deadline: _Deadline

    def __iter__(self) -> Iterator[bytes]:
        got = 0
        try:
            for chunk in self.inner:
                got += len(chunk)
                if got > self.limit:
                    raise AnswerTooLarge(self.limit)
                yield chunk
        except _HTTPCORE_FAILURES as err:
            raise _mapped(err, self.request, self.deadline) from None

    def close(self) -> None:
        try:
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()
        finally:
            self.pool.close()


@dataclass
class _BoundedTransport(httpx.BaseTransport):
    """A new httpcore pool per call, verifying with the service account's CA, whose backend holds
    the call's deadline (`whole` seconds, connect to last byte); the body is bounded."""

    context: ssl.SSLContext
    limit: int
    whole: float

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, Iterable)  # a sync client's body
        deadline = _Deadline(self.whole)
        pool = httpcore.ConnectionPool(ssl_context=self.context, network_backend=_DeadlineBackend(deadline))
        call = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            answer = pool.handle_request(call)
        except _HTTPCORE_FAILURES as err:
            pool.close()
            raise _mapped(err, request, deadline) from None
        except BaseException:
            pool.close()
            raise
        assert isinstance(answer.stream, Iterable)  # a sync pool's body
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            stream=_BoundedStream(answer.stream, self.limit, pool, request, deadline),
            extensions=answer.extensions,
            request=request,
        )


def api_client(sa: ServiceAccount, *, timeout: float = API_TIMEOUT, max_answer: int = MAX_ANSWER_BYTES) -> Client:
    """A lightkube Client with `sa`'s token, each whole call bounded by `timeout`, each answer by
    `max_answer`. After a 401 (a rotated token), make a new one from a fresh service_account."""
    context = ssl.create_default_context()
    context.load_verify_locations(cadata=sa.ca_pem)
    # The transport replaces httpx's own; the CA file is named so that lightkube's unused
    # context loads it rather than the system's store.
    config = KubeConfig.from_one(
        cluster=Cluster(server=sa.server, certificate_auth=sa.ca_path), user=User(token=sa.token), namespace="default"
    )
    return Client(
        config,
        timeout=httpx.Timeout(timeout),
        trust_env=False,
        transport=_BoundedTransport(context, max_answer, timeout),
    )


def status_of(err: BaseException) -> int | None:
    """The HTTP status of an API error; None for an error that is no answer."""
    return err.response.status_code if isinstance(err, httpx.HTTPStatusError) else None


def describe(err: BaseException, where: str) -> str:
    """One line for an error a lightkube call raised (one of API_FAILURES) to the API server at `where` (host:port)."""
    if isinstance(err, httpx.HTTPStatusError):
        return f"HTTP {err.response.status_code} ({err.response.reason_phrase})"
    if isinstance(err, AnswerTooLarge):
        return str(err)
    if isinstance(err, CallDeadline):
        return f"the API server at {where} did not answer in time ({err})"
    if isinstance(err, httpx.TimeoutException):
        return f"the API server at {where} did not answer in time ({type(err).__name__})"
    if isinstance(err, httpx.HTTPError | OSError):  # TLS failures included
        return f"the API server at {where} did not answer: {err}"
    if isinstance(err, msgspec.ValidationError):
        return f"the answer is not what was asked for ({err})"
    return f"the answer is not JSON ({err})"  # msgspec.DecodeError, json's: both ValueErrors


# What a lightkube call raises for a server that is down, slow, refusing or wrong.
API_FAILURES: tuple[type[BaseException], ...] = (httpx.HTTPError, AnswerTooLarge, OSError, ValueError)
