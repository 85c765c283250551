"""The agent's endpoints hold up: a flood of idle or dripping connections costs a bounded
number of threads for a few seconds, and the probes still get their answers.

The server listens on 127.0.0.1 here, so a client on 127.0.0.1 is the node's own address (as
the kubelet is, probing a hostNetwork pod at the node IP) and one on any other 127.x address is
another host."""

from __future__ import annotations

import contextlib
import errno
import io
import select
import socket
import threading
import time
import urllib.request

import pytest

from reaper.http import (
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_REQUEST_LINE,
    NODE_CONNECTIONS,
    PER_CLIENT,
    REQUEST_DEADLINE,
    HeadTooLarge,
    HealthServer,
    ListenError,
    listen_problem,
    read_head,
)


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


def _held(conn: socket.socket) -> bool:
    """The server still holds `conn` open: it has neither answered nor cut it off (either makes
    the client's end readable: an answer, or the end of the stream)."""
    readable, _, _ = select.select([conn], [], [], 0)
    return not readable


def _healthz_beside(server: HealthServer, source: str, conns: list[socket.socket]) -> None:
    """`source`'s probe is answered while every connection of `conns` still holds its slot: it
    took a slot of its own, not one of theirs (a slot frees only when one is cut off, at
    REQUEST_DEADLINE; a connection without a slot is closed unanswered at once)."""
    assert _healthz_from(server, source) == 200
    assert all(_held(conn) for conn in conns), "a slot was freed (a connection cut off) before the answer"


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
        _healthz_beside(server, "127.0.0.1", conns)  # the node's own slots are not theirs
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
        holding = [conn for conn in conns if _held(conn)]  # the rest were closed at once, unadmitted
        assert len(holding) == MAX_CONNECTIONS
        for _ in range(5):
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.sendall(b"E")
            _healthz_beside(server, "127.0.0.1", holding)
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
        _healthz_beside(server, "127.0.0.2", conns)
    finally:
        for conn in conns:
            conn.close()
        server.close()


def _ask(server: HealthServer, request: bytes, source: str = "127.0.0.2") -> tuple[int | None, bytes]:
    """(the status answered, the whole answer) to `request` sent whole, or (None, b"") when the
    server closed or reset the connection without an answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(source, 0)) as conn:
        with contextlib.suppress(OSError):  # closed while sending: the server stopped reading
            conn.sendall(request)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(4096):
                answer += chunk
    parts = answer.split(b" ", 2)
    status = int(parts[1]) if answer.startswith(b"HTTP/") and len(parts) > 1 and parts[1].isdigit() else None
    return status, answer


# What Prometheus sends (prometheus/prometheus scrape/scrape.go, targetScraper.scrape), with a
# service-account token as a bearer token, as a scrape config's `authorization` sends it.
PROMETHEUS_SCRAPE = (
    b"GET /metrics HTTP/1.1\r\nHost: 10.0.0.1:9753\r\nUser-Agent: Prometheus/3.1.0\r\n"
    b"Accept: application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    b"application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    b"text/plain;version=0.0.4;q=0.3,*/*;q=0.2\r\n"
    b"Accept-Encoding: gzip\r\nAuthorization: Bearer " + b"e" * 2048 + b"\r\n"
    b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
)
KUBELET_PROBE = (
    b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:9753\r\nUser-Agent: kube-probe/1.31\r\n"
    b"Accept: */*\r\nConnection: close\r\n\r\n"
)


def _request(*header_lines: bytes, target: bytes = b"/healthz") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: 10.0.0.1\r\n" + b"".join(h + b"\r\n" for h in header_lines) + b"\r\n"


def test_a_prometheus_scrape_and_a_kubelet_probe_are_answered() -> None:
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    try:
        status, answer = _ask(server, PROMETHEUS_SCRAPE)
        assert status == 200 and answer.endswith(b"\r\n\r\nmetrics\n")
        status, answer = _ask(server, KUBELET_PROBE, source="127.0.0.1")
        assert status == 200 and answer.endswith(b"\r\n\r\nok\n")
        assert _ask(server, _request(target=b"/metrics?x=" + b"y" * 4000))[0] == 200  # a query string is ignored
    finally:
        server.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        # One header line of 64 KiB: the stock handler takes it (and 99 more).
        (_request(b"X-Fill: " + b"a" * (64 * 1024 - 10)), 431),
        (_request(*(b"X-Fill: " + b"a" * 1000 for _ in range(9))), 431),  # over the bytes of the block
        (_request(*(b"X-%d: a" % n for n in range(MAX_HEADERS + 1))), 431),  # over the count
        (_request(target=b"/metrics?" + b"q" * MAX_REQUEST_LINE), 414),
    ],
    ids=["one-64-kib-line", "block-over-bytes", "too-many-lines", "request-line"],
)
def test_a_head_over_its_bound_is_answered_and_closed(request_bytes: bytes, status: int) -> None:
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    try:
        assert _ask(server, request_bytes)[0] == status
        assert _ask(server, KUBELET_PROBE, source="127.0.0.1")[0] == 200
    finally:
        server.close()


def test_heads_just_within_the_bounds_are_answered() -> None:
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    try:
        line = b"GET /healthz?" + b"q" * (MAX_REQUEST_LINE - len(b"GET /healthz? HTTP/1.0\r\n")) + b" HTTP/1.0\r\n"
        assert len(line) == MAX_REQUEST_LINE
        assert _ask(server, line + b"\r\n")[0] == 200
        fields = [b"X-%02d: " % n + b"a" * 200 for n in range(MAX_HEADERS)]
        assert len(b"".join(f + b"\r\n" for f in fields)) + len(b"Host: 10.0.0.1\r\n\r\n") < MAX_HEADER_BYTES
        assert _ask(server, _request(*fields[:-1]))[0] == 200
    finally:
        server.close()


def test_a_request_with_a_body_is_answered_without_reading_it() -> None:
    """A method other than GET is answered 501 and closed; the body it announces is never read."""
    server = HealthServer("127.0.0.1", 0, lambda: b"metrics\n", lambda: (True, "ok"))
    try:
        post = b"POST /metrics HTTP/1.1\r\nHost: 10.0.0.1\r\nContent-Length: 1073741824\r\n\r\n"
        assert _ask(server, post)[0] == 501  # a body read would wait for the deadline and be cut off unanswered
    finally:
        server.close()


def test_a_port_in_use_is_a_listen_error_naming_it_and_the_fix() -> None:
    """Issue 35: a port in use raised AttributeError ('_closing') and hid EADDRINUSE."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ListenError) as raised:
            HealthServer("127.0.0.1", taken.getsockname()[1], lambda: b"", lambda: (True, "ok"))
    assert isinstance(raised.value.__cause__, OSError) and raised.value.__cause__.errno == errno.EADDRINUSE
    assert str(raised.value) == (
        "Address already in use (EADDRINUSE); another process listens on that port (node_exporter's is 9100): "
        "give a free port"
    )


@pytest.mark.parametrize(
    ("err", "line"),
    [
        (OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), "(EADDRNOTAVAIL); HOST is not an address"),
        (OSError(errno.EACCES, "Permission denied"), "(EACCES); a port under 1024 needs CAP_NET_BIND_SERVICE"),
        (OSError(errno.EAFNOSUPPORT, "Address family not supported"), "(EAFNOSUPPORT); this node has no IPv6"),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "(EAI_NONAME); HOST is neither an IP"),
        (OSError(errno.ENOBUFS, "No buffer space available"), "(ENOBUFS); give a HOST:PORT this node can listen"),
    ],
)
def test_each_listen_error_says_its_name_and_a_fix(err: OSError, line: str) -> None:
    assert line in listen_problem(err)


def test_the_head_is_read_and_never_a_byte_past_it_or_its_bound() -> None:
    stream = io.BytesIO(KUBELET_PROBE + b"a body never read")
    head = read_head(stream)
    assert head is not None and head.request_line == b"GET /healthz HTTP/1.1\r\n"
    assert stream.read() == b"a body never read"
    fat = b"GET / HTTP/1.1\r\n" + b"X-Fill: " + b"a" * (64 * 1024) + b"\r\n\r\n"
    stream = io.BytesIO(fat)
    with pytest.raises(HeadTooLarge) as raised:
        read_head(stream)
    assert raised.value.status == 431
    assert stream.tell() <= len(b"GET / HTTP/1.1\r\n") + MAX_HEADER_BYTES + 1
    assert read_head(io.BytesIO(b"GET / HTTP/1.1\r\nHost: a")) is None  # closed before the blank line
