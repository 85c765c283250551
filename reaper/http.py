"""The agent's HTTP endpoints: /metrics, /healthz and /readyz."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

NOT_FOUND = b"not found: try /metrics, /healthz, /readyz\n"
MAX_CONNECTIONS = 32  # served at once from other addresses; more are closed at once (a scraper needs one or two)
PER_CLIENT = 4  # at once from one other address
# Served at once from the node's own address, apart from the MAX_CONNECTIONS: the kubelet's
# liveness and readiness probes come from there, and a host elsewhere cannot connect from it, so
# no number of other addresses takes these slots.
NODE_CONNECTIONS = 8
REQUEST_DEADLINE = 5.0  # seconds a connection has, in all, to send its request and take the answer
_WATCH_EVERY = 0.25


def from_own_address(conn: socket.socket, client: str) -> bool:
    """Whether the connection comes from the very address it reached: what the kernel picks when
    a process on this node (the kubelet probing a hostNetwork pod at its pod IP, the node's)
    connects to one of the node's addresses without choosing a source. Another host cannot make
    such a connection: the kernel drops a packet that arrives from outside with one of the node's
    own addresses as its source, and the answer to one would stay on the node."""
    try:
        return str(conn.getsockname()[0]) == client
    except OSError:  # already reset: served as anyone's
        return False


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, but never more than MAX_CONNECTIONS of them from other addresses,
    PER_CLIENT from one address, and NODE_CONNECTIONS from the node's own address; each cut off
    REQUEST_DEADLINE after it was accepted whatever it sends (a per-read timeout would restart
    with every byte a slow client drips). A flood of idle or dripping connections from any number
    of addresses costs a bounded number of threads for a few seconds, and the kubelet's probes,
    from the node's own address, have slots no other address can take."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    # The listen backlog. Connections turned away wait here to be accepted and closed; while it is
    # full the kernel drops every new SYN, the kubelet's too (its connect then waits for a
    # retransmission), so it holds a burst far above the slots (the kernel caps it at
    # net.core.somaxconn).
    request_queue_size = 4096

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        # Set before the socket is bound: a bind that fails (the port in use) calls server_close.
        self._lock = threading.Lock()
        self._per_client: dict[str, int] = {}
        self._others = 0  # admitted connections from other addresses
        self._own = 0  # admitted connections from the node's own address
        self._deadlines: dict[socket.socket, tuple[float, bool]] = {}  # connection -> (deadline, own)
        self._closing = threading.Event()
        super().__init__(address, handler)

    def server_activate(self) -> None:
        super().server_activate()
        threading.Thread(target=self._cut_off_late, name="http-deadlines", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0])
        own = from_own_address(request, client)
        with self._lock:
            if own:
                admitted = self._own < NODE_CONNECTIONS
            else:
                admitted = self._others < self.max_connections and self._per_client.get(client, 0) < PER_CLIENT
            if admitted:
                if own:
                    self._own += 1
                else:
                    self._others += 1
                    self._per_client[client] = self._per_client.get(client, 0) + 1
                self._deadlines[request] = (time.monotonic() + REQUEST_DEADLINE, own)
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

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exception(), OSError):
            return  # the client went away or was cut off at the deadline: nothing to log
        super().handle_error(request, client_address)

    def _release(self, request: socket.socket, client: str) -> None:
        with self._lock:
            held = self._deadlines.pop(request, None)
            if held is None:
                return
            if held[1]:
                self._own -= 1
                return
            self._others -= 1
            left = self._per_client.get(client, 1) - 1
            if left:
                self._per_client[client] = left
            else:
                self._per_client.pop(client, None)

    def _cut_off_late(self) -> None:
        while not self._closing.wait(_WATCH_EVERY):
            now = time.monotonic()
            with self._lock:
                late = [conn for conn, (deadline, _) in self._deadlines.items() if deadline < now]
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
            return  # periodic scrapes are not news

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
