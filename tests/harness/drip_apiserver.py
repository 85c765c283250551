"""An API server that answers one byte at a time, for ever: over real TLS with a CA of the test's
own (tests.harness.apiserver's PKI and service-account dir), it reads the request and then sends
a status line and a header that never ends, a byte every `interval` seconds. A client whose
deadline is per read waits as long as the server likes; the server notes when the client closed
the connection (a send fails, or a read sees the end).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.apiserver import TOKEN, make_pki

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Drip: "


@dataclass
class DripServer:
    host: str
    port: int
    sa_dir: Path
    sent: int = 0  # bytes of answer sent, over every connection
    closed: threading.Event = field(default_factory=threading.Event)  # a client closed its connection
    dripped: threading.Condition = field(default_factory=threading.Condition)  # notified at each byte sent

    def wait_for_sent(self, count: int, timeout: float = 10.0) -> bool:
        """Whether `count` bytes of answer have been sent (over every connection) within `timeout`."""
        with self.dripped:
            return self.dripped.wait_for(lambda: self.sent >= count, timeout)

    def env(self) -> dict[str, str]:
        """The variables a pod gets, and where its service-account files are."""
        return {
            "KUBERNETES_SERVICE_HOST": self.host,
            "KUBERNETES_SERVICE_PORT": str(self.port),
            "REAPER_SERVICEACCOUNT_DIR": str(self.sa_dir),
        }


def _gone(conn: ssl.SSLSocket) -> bool:
    """The client closed its end (the read side is at its end, or broken)."""
    readable, _, _ = select.select([conn], [], [], 0)
    if not readable:
        return False
    try:
        return conn.recv(1) == b""
    except (OSError, ssl.SSLError):
        return True


def _drip(conn: ssl.SSLSocket, state: DripServer, interval: float, stop: threading.Event) -> None:
    try:
        conn.settimeout(10)
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = conn.recv(4096)
            if not chunk:
                return
            request += chunk
        conn.settimeout(2)  # a read after select: a part of a TLS record waits at most this
        n = 0
        while not stop.wait(interval):
            if _gone(conn):
                state.closed.set()
                return
            byte = HEAD[n : n + 1] or b"a"
            conn.sendall(byte)
            with state.dripped:
                state.sent += 1
                state.dripped.notify_all()
            n += 1
    except (OSError, ssl.SSLError):
        state.closed.set()
    finally:
        with contextlib.suppress(OSError):
            conn.close()


@contextmanager
def drip_server(directory: Path, interval: float = 0.2) -> Iterator[DripServer]:
    """Serve on 127.0.0.1 (a free port) until the block ends."""
    ca_crt, crt, key = make_pki(directory)
    sa_dir = directory / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text(TOKEN)
    (sa_dir / "ca.crt").write_bytes(ca_crt.read_bytes())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    state = DripServer("127.0.0.1", listener.getsockname()[1], sa_dir)
    stop = threading.Event()
    workers: list[threading.Thread] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                raw.settimeout(10)
                conn = context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):
                raw.close()
                continue
            worker = threading.Thread(target=_drip, args=(conn, state, interval, stop), daemon=True)
            worker.start()
            workers.append(worker)

    acceptor = threading.Thread(target=serve, daemon=True)
    acceptor.start()
    try:
        yield state
    finally:
        stop.set()
        acceptor.join(timeout=10)
        for worker in workers:
            worker.join(timeout=10)
        listener.close()
