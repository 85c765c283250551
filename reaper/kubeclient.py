"""A lightkube client for the pod's service account (reaper.kubeapi), for the pod-CIDR lookup
(reaper.podcidr) and the Node's Events (reaper.events).

lightkube speaks the API: paths, typed resources (msgspec Structs, as the reaper's own
records), status errors. What this module adds is what the reaper asks of every input: the
server is verified with the service account's CA alone, no proxy or CA comes from the
environment, every call has a deadline, and every answer is cut off past a size by a transport
that counts the bytes as they arrive, so a broken or hostile server costs no more memory than a
bounded file does.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

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


class _BoundedStream(httpx.SyncByteStream):
    """A response body that stops with AnswerTooLarge once more than `limit` bytes came."""

    def __init__(self, inner: httpx.SyncByteStream, limit: int) -> None:
        self.inner = inner
        self.limit = limit

    def __iter__(self) -> Iterator[bytes]:
        got = 0
        for chunk in self.inner:
            got += len(chunk)
            if got > self.limit:
                raise AnswerTooLarge(self.limit)
            yield chunk

    def close(self) -> None:
        self.inner.close()


class _BoundedTransport(httpx.BaseTransport):
    """httpx's own transport, verifying with the service account's CA, every body bounded."""

    def __init__(self, context: ssl.SSLContext, limit: int) -> None:
        self.inner = httpx.HTTPTransport(verify=context, trust_env=False)
        self.limit = limit

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)  # a sync transport's body
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_BoundedStream(stream, self.limit),
            extensions=response.extensions,
            request=request,
        )

    def close(self) -> None:
        self.inner.close()


def api_client(sa: ServiceAccount, *, timeout: float = API_TIMEOUT, max_answer: int = MAX_ANSWER_BYTES) -> Client:
    """A lightkube Client with `sa`'s token, each call bounded by `timeout`, each answer by
    `max_answer`. The token is the one read into `sa`: after a 401 (the kubelet rotates it),
    make a new client from a fresh reaper.kubeapi.service_account."""
    context = ssl.create_default_context()
    context.load_verify_locations(cadata=sa.ca_pem)
    # A transport given to httpx replaces the one it would make from the config's CA: the
    # config names the CA file only so lightkube's own context, made and unused, loads that
    # file rather than the system's store.
    config = KubeConfig.from_one(
        cluster=Cluster(server=sa.server, certificate_auth=sa.ca_path), user=User(token=sa.token), namespace="default"
    )
    return Client(
        config,
        timeout=httpx.Timeout(timeout),
        trust_env=False,
        transport=_BoundedTransport(context, max_answer),
    )


def status_of(err: BaseException) -> int | None:
    """The HTTP status of an API error; None for an error that is no answer."""
    return err.response.status_code if isinstance(err, httpx.HTTPStatusError) else None


def describe(err: BaseException, where: str) -> str:
    """One line for an error a lightkube call raised (one of API_FAILURES) to the API server at
    `where` (host:port)."""
    if isinstance(err, httpx.HTTPStatusError):
        return f"HTTP {err.response.status_code} ({err.response.reason_phrase})"
    if isinstance(err, AnswerTooLarge):
        return str(err)
    if isinstance(err, httpx.TimeoutException):
        return f"the API server at {where} did not answer in time ({type(err).__name__})"
    if isinstance(err, httpx.HTTPError | OSError):  # TLS failures included
        return f"the API server at {where} did not answer: {err}"
    if isinstance(err, msgspec.ValidationError):
        return f"the answer is not what was asked for ({err})"
    return f"the answer is not JSON ({err})"  # msgspec.DecodeError, json's: both ValueErrors


# What a lightkube call raises for a server that is down, slow, refusing or wrong.
API_FAILURES: tuple[type[BaseException], ...] = (httpx.HTTPError, AnswerTooLarge, OSError, ValueError)
