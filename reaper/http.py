"""The agent's HTTP endpoints: /metrics, /healthz and /readyz."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

NOT_FOUND = b"not found: try /metrics, /healthz, /readyz\n"
MAX_CONNECTIONS = 32  # served at once; more are closed at once (a scraper needs one or two)
IDLE_TIMEOUT = 10.0  # seconds a connection may send nothing before it is closed


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, but never more than MAX_CONNECTIONS of them: a flood of idle
    connections costs a few threads for IDLE_TIMEOUT seconds, not memory without end."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    request_queue_size = 128  # the listen backlog: a burst waits to be accepted (and closed)

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _IPv6Server(_BoundedServer):
    address_family = socket.AF_INET6


Check = Callable[[], tuple[bool, str]]


def _handler(metrics: Callable[[], bytes], readiness: Check, health: Check) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "cni-reaper"
        timeout = IDLE_TIMEOUT

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
