"""The agent's endpoints hold up: a flood of idle or dripping connections costs a bounded
number of threads for a few seconds, and the probes still get their answers.

The server listens on 127.0.0.1 here, so a client on 127.0.0.1 is the node's own address (as
the kubelet is, probing a hostNetwork pod at the node IP) and one on any other 127.x address is
another host."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
import urllib.request

import pytest

from reaper.http import MAX_CONNECTIONS, NODE_CONNECTIONS, PER_CLIENT, REQUEST_DEADLINE, HealthServer


def test_idle_connections_cost_a_bounded_number_of_threads() -> None:
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    idle: list[socket.socket] = []
    try:
        before = threading.active_count()
        for n in range(MAX_CONNECTIONS * 6):
            for source in ("127.0.0.1", f"127.0.3.{n % 64 + 1}"):  # the node's own address, others
                idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(source, 0)))
        time.sleep(0.5)
        assert threading.active_count() - before <= MAX_CONNECTIONS + NODE_CONNECTIONS
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


def _healthz_from(server: HealthServer, source: str, timeout: float = 2.0) -> int | None:
    """The status /healthz answers a client on `source`, or None when it is closed unanswered."""
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=timeout, source_address=(source, 0)) as conn:
            conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            answer = conn.recv(64)
    except OSError:
        return None
    return int(answer.split()[1]) if answer.startswith(b"HTTP/") else None


def _healthz_within(server: HealthServer, source: str, budget: float) -> None:
    started = time.monotonic()
    assert _healthz_from(server, source, timeout=budget) == 200
    assert time.monotonic() - started < budget


def _drip(server: HealthServer, sources: list[str]) -> list[socket.socket]:
    conns = []
    for source in sources:
        conn = socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(source, 0))
        conn.sendall(b"G")
        conns.append(conn)
    return conns


def test_one_client_dripping_bytes_never_takes_the_probes_slots() -> None:
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    conns = _drip(server, ["127.0.0.2"] * MAX_CONNECTIONS)
    try:
        for _ in range(3):
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.sendall(b"E")  # a byte now and then: a per-read timeout would never fire
            assert _healthz_from(server, "127.0.0.1") == 200
            time.sleep(0.5)
    finally:
        for conn in conns:
            conn.close()
        server.close()


def test_connections_from_many_clients_are_cut_off_at_the_deadline_whatever_they_send(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    sources = [f"127.0.1.{n}" for n in range(1, MAX_CONNECTIONS + 1)]
    conns = _drip(server, sources)
    try:
        time.sleep(0.3)
        assert _healthz_from(server, "127.0.0.2") is None, "every slot of other addresses is taken"
        _healthz_within(server, "127.0.0.1", 1.0)  # the node's own slots are not theirs
        started = time.monotonic()
        answered = None
        while answered != 200 and time.monotonic() - started < REQUEST_DEADLINE + 3:
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.sendall(b"E")
            answered = _healthz_from(server, "127.0.0.2")
            time.sleep(0.2)
        assert answered == 200, "the dripping connections were cut off"
        assert time.monotonic() - started < REQUEST_DEADLINE + 3
    finally:
        for conn in conns:
            conn.close()
        server.close()
    # A connection cut off is no error of the agent's: no traceback on its log (stderr) for it.
    assert "Traceback" not in capsys.readouterr().err


def test_no_number_of_other_addresses_takes_the_slots_of_the_nodes_own() -> None:
    """Issue 23, case 5: 8 addresses with PER_CLIENT connections each took every slot, and the
    kubelet's probes went unanswered. Here 64 addresses drip into as many as they may."""
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    conns = _drip(server, [f"127.0.2.{n}" for n in range(1, 65) for _ in range(PER_CLIENT)])
    try:
        time.sleep(0.3)
        for _ in range(5):
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.sendall(b"E")
            _healthz_within(server, "127.0.0.1", 1.0)
            assert _healthz_from(server, "127.0.0.2") is None, "another address finds every slot of theirs taken"
            time.sleep(0.2)
    finally:
        for conn in conns:
            conn.close()
        server.close()


def test_the_nodes_own_address_has_a_bounded_number_of_slots_too() -> None:
    """A process on the node can hold its own address's slots (until the deadline), never more,
    and never the slots of other addresses."""
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    conns = _drip(server, ["127.0.0.1"] * NODE_CONNECTIONS)
    try:
        time.sleep(0.3)
        assert _healthz_from(server, "127.0.0.1") is None, "every slot of the node's own address is taken"
        _healthz_within(server, "127.0.0.2", 1.0)
    finally:
        for conn in conns:
            conn.close()
        server.close()


def test_a_port_in_use_is_an_oserror_naming_it() -> None:
    """Issue 35: a port in use raised AttributeError ('_closing') and hid EADDRINUSE."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as raised:
            HealthServer("127.0.0.1", taken.getsockname()[1], lambda: b"", lambda: (True, "ok"))
    assert raised.value.errno == errno.EADDRINUSE
