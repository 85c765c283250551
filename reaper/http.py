"""The agent's HTTP endpoints: /metrics, /healthz and /readyz."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

NOT_FOUND = b"not found: try /metrics, /healthz, /readyz\n"
MAX_CONNECTIONS = 32  # served at once; more are closed at once (a scraper needs one or two)
PER_CLIENT = 4  # at once from one address: one client cannot take every slot from the probes
REQUEST_DEADLINE = 5.0  # seconds a connection has, in all, to send its request and take the answer
_WATCH_EVERY = 0.25


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, but never more than MAX_CONNECTIONS of them, PER_CLIENT from
    one address, each cut off REQUEST_DEADLINE after it was accepted whatever it sends (a
    per-read timeout would restart with every byte a slow client drips). A flood of idle or
    dripping connections costs a few threads for a few seconds, and the kubelet's probes,
    from the node's own address, keep their slots."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    request_queue_size = 128  # the listen backlog: a burst waits to be accepted (and closed)

    def server_activate(self) -> None:
        super().server_activate()
        self._lock = threading.Lock()
        self._per_client: dict[str, int] = {}
        self._deadlines: dict[socket.socket, float] = {}
        self._closing = threading.Event()
        threading.Thread(target=self._cut_off_late, name="http-deadlines", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0])
        with self._lock:
            admitted = len(self._deadlines) < self.max_connections and self._per_client.get(client, 0) < PER_CLIENT
            if admitted:
                self._per_client[client] = self._per_client.get(client, 0) + 1
                self._deadlines[request] = time.monotonic() + REQUEST_DEADLINE
        if not admitted:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request, client)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request, str(client_address[0]))

    def _release(self, request: socket.socket, client: str) -> None:
        with self._lock:
            self._deadlines.pop(request, None)
            left = self._per_client.get(client, 1) - 1
            if left:
                self._per_client[client] = left
            else:
                self._per_client.pop(client, None)

    def _cut_off_late(self) -> None:
        while not self._closing.wait(_WATCH_EVERY):
            now = time.monotonic()
            with self._lock:
                late = [conn for conn, deadline in self._deadlines.items() if deadline < now]
            for conn in late:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)  # the worker's read or write returns at once

    def server_close(self) -> None:
        self._closing.set()
        super().server_close()


class _IPv6Server(_BoundedServer):
    address_family = socket.AF_INET6


Check = Callable[[], tuple[bool, str]]


def _handler(metrics: Callable[[], bytes], readiness: Check, health: Check) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "cni-reaper"
        timeout = REQUEST_DEADLINE

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(HTTPStatus.OK, metrics(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, why = health() if path == "/healthz" else readiness()
                status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
                self._send(status, f"{why}\n".encode(), "text/plain")
            else:
                self._send(HTTPStatus.NOT_FOUND, NOT_FOUND, "text/plain")

        def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # scrapes every 15s are not news

    return Handler


class HealthServer:
    """Serves the endpoints on a thread of its own until closed. Raises OSError when it cannot
    listen."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Callable[[], bytes],
        readiness: Check,
        health: Check = lambda: (True, "ok"),
    ) -> None:
        server_class = _IPv6Server if ":" in host else _BoundedServer
        self._server = server_class((host, port), _handler(metrics, readiness, health))
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
