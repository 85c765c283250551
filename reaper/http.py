"""The agent's HTTP endpoints: /metrics, /healthz and /readyz, GET only, with bounded connections,
a deadline per connection and a bounded request head (SECURITY.md, "Floods of the metrics port";
the bounds' sources: docs/design.md, "In depth: the core, state and what is reported")."""

from __future__ import annotations

import contextlib
import errno
import io
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

NOT_FOUND = b"not found: try /metrics, /healthz, /readyz\n"
MAX_CONNECTIONS = 32  # served at once from other addresses; more are closed at once (a scraper needs one or two)
PER_CLIENT = 4  # at once from one other address
# From the node's own address, apart from MAX_CONNECTIONS: the kubelet's probes, which no other
# host can connect from.
NODE_CONNECTIONS = 8
REQUEST_DEADLINE = 5.0  # seconds a connection has, in all, to send its request and take the answer
_WATCH_EVERY = 0.25
# What one request may send, read before the stock parser (which takes 6.4 MiB of headers).
MAX_REQUEST_LINE = 8 * 1024  # bytes of "GET /path?query HTTP/1.1\r\n"; past it: 414
MAX_HEADER_BYTES = 8 * 1024  # bytes of all header lines together, the blank line after them included; past it: 431
MAX_HEADERS = 32  # header lines; past it: 431


def from_own_address(conn: socket.socket, client: str) -> bool:
    """Whether the connection comes from the very address it reached: a process on this node
    (the kubelet's probe), since the kernel drops outside packets with a local source."""
    try:
        return str(conn.getsockname()[0]) == client
    except OSError:  # already reset: served as anyone's
        return False


@dataclass(frozen=True, kw_only=True)
class RequestHead:
    request_line: bytes
    header_lines: bytes  # every header line, the blank line that ends them included


class HeadTooLarge(Exception):
    """A request line or header block past its bound: answered with `status`, then closed."""

    def __init__(self, status: HTTPStatus, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


def read_head(stream: io.BufferedIOBase) -> RequestHead | None:
    """The request line and the header lines from `stream`, never reading past MAX_REQUEST_LINE
    and MAX_HEADER_BYTES (a body, if any, is never read); None when the client closed before the
    blank line that ends them. Raises HeadTooLarge."""
    request_line = stream.readline(MAX_REQUEST_LINE + 1)
    if len(request_line) > MAX_REQUEST_LINE:
        raise HeadTooLarge(HTTPStatus.REQUEST_URI_TOO_LONG, f"request line over {MAX_REQUEST_LINE} bytes")
    if not request_line.endswith(b"\n"):
        return None
    lines: list[bytes] = []
    size = 0
    while True:
        line = stream.readline(MAX_HEADER_BYTES - size + 1)
        size += len(line)
        if size > MAX_HEADER_BYTES:
            raise HeadTooLarge(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"headers over {MAX_HEADER_BYTES} bytes")
        if not line.endswith(b"\n"):
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return RequestHead(request_line=request_line, header_lines=b"".join(lines))
        if len(lines) > MAX_HEADERS:
            raise HeadTooLarge(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {MAX_HEADERS} header lines")


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS from other addresses, PER_CLIENT from
    one, NODE_CONNECTIONS from the node's own; each cut off REQUEST_DEADLINE after it was
    accepted, whatever it sends (a per-read timeout restarts with every byte dripped)."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    # Turned-away connections wait here to be closed; a full backlog drops the kubelet's SYN too.
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
            self._per_client[client] = self._per_client.get(client, 1) - 1
            if not self._per_client[client]:
                del self._per_client[client]

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

        def handle_one_request(self) -> None:
            """One request a connection (HTTP/1.0), its head read within the bounds before the
            stock parser sees it; another method than GET is answered 501, its body never read."""
            self.close_connection = True
            try:
                head = read_head(self.rfile)
            except HeadTooLarge as err:
                self.requestline, self.request_version, self.command = "", "", ""
                self.send_error(err.status, explain=err.why)
                return
            if head is None:
                return
            self.raw_requestline = head.request_line
            connection = self.rfile
            self.rfile = io.BytesIO(head.header_lines)  # the stock parser reads the headers from here
            try:
                parsed = self.parse_request()
            finally:
                self.rfile = connection  # finish() closes it, and with it the socket's last reference
            self.close_connection = True  # whatever its Connection header says
            if not parsed:
                return
            if self.command != "GET":
                self.send_error(HTTPStatus.NOT_IMPLEMENTED, explain=f"unsupported method {self.command!r}")
                return
            self.do_GET()
            self.wfile.flush()

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


class ListenError(Exception):
    """The endpoints cannot listen at HOST:PORT; one line: the OS's error, its name, the fix."""


# What to give instead, by the OS's error on bind (socket.gaierror's are EAI_*, negative).
_LISTEN_FIXES = {
    errno.EADDRINUSE: "another process listens on that port (node_exporter's is 9100): give a free port",
    errno.EADDRNOTAVAIL: "HOST is not an address of this node: give one of its addresses, 0.0.0.0 or 127.0.0.1",
    errno.EACCES: "a port under 1024 needs CAP_NET_BIND_SERVICE: give a port from 1024 up",
    errno.EAFNOSUPPORT: "this node has no IPv6: give an IPv4 address",
    errno.EINVAL: "give an address of this node (a link-local one with its %interface)",
}


def _error_name(err: OSError) -> str:
    if isinstance(err, socket.gaierror):
        names = {getattr(socket, n): n for n in dir(socket) if n.startswith("EAI_")}
        return names.get(err.errno, "") if err.errno is not None else ""
    return errno.errorcode.get(err.errno, "") if err.errno is not None else ""


def listen_problem(err: OSError) -> str:
    """One line: what the OS said when the server could not listen, its name, and the fix."""
    said = err.strerror or str(err)
    name = _error_name(err)
    if isinstance(err, socket.gaierror):
        fix = "HOST is neither an IP address nor a name this node resolves: give an IP address"
    else:
        fix = _LISTEN_FIXES.get(err.errno or 0, "give a HOST:PORT this node can listen on")
    return f"{said} ({name}); {fix}" if name else f"{said}; {fix}"


class HealthServer:
    """Serves the endpoints on a thread of its own until closed; ListenError if it cannot listen."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Callable[[], bytes],
        readiness: Check,
        health: Check = lambda: (True, "ok"),
    ) -> None:
        server_class = _IPv6Server if ":" in host else _BoundedServer
        try:
            self._server = server_class((host, port), _handler(metrics, readiness, health))
        except OSError as err:
            raise ListenError(listen_problem(err)) from err
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
