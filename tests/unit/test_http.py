"""The agent's endpoints hold up: a flood of idle connections costs a bounded number of
threads, and a scrape still gets its answer once they time out or go."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

from reaper.http import MAX_CONNECTIONS, HealthServer


def test_idle_connections_cost_a_bounded_number_of_threads() -> None:
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    idle: list[socket.socket] = []
    try:
        before = threading.active_count()
        for _ in range(MAX_CONNECTIONS * 6):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_CONNECTIONS
    finally:
        for conn in idle:
            conn.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=2) as answer:
                assert answer.status == 200 and answer.read() == b"ok\n"
                break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    server.close()
