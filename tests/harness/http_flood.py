"""The agent's HTTP server on its own, and a flood of idle and dripping connections from many
source addresses, for tests/node/test_http_flood.py. Each runs as a process of its own inside
one of the test's network namespaces (entered with nsenter), so the flood and the server never
share an interpreter lock with each other or with the test's probes:

    python -m tests.harness.http_flood serve HOST PORT
        listens with reaper.http.HealthServer, prints "listening", serves until stdin closes;
    python -m tests.harness.http_flood flood HOST PORT --source ADDR... [--per-source N]
        each source keeps N connections open to HOST:PORT, each having sent a byte of a request
        and dripping one more now and then, and opens a new one whenever the server closes one,
        for a bounded time and number of connections; prints what happened as JSON;
    python -m tests.harness.http_flood heads HOST PORT --source ADDR... --per-source N --seconds S
        each source keeps N connections open to HOST:PORT, each sending a GET with 100 header
        lines of 64 KiB (what the stock request handler takes: 6.4 MiB) and no blank line after
        them, then waiting for the server to answer or close; a new one whenever one is closed,
        for S seconds; prints what happened as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import selectors
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from reaper.http import PER_CLIENT, HealthServer

ROUND = 0.1  # seconds between rounds of (re)connecting and dripping
MAX_CONNECTS = 50_000  # connections one flood opens at most, whatever its duration
HEADER_LINES = 100  # as many header lines as the stock request handler takes
HEADER_LINE_BYTES = 64 * 1024  # as long a line as it takes, CRLF included


@dataclass
class FloodReport:
    connects: int = 0  # connections attempted
    failed: int = 0  # never established (refused, timed out, no route)
    turned_away: int = 0  # closed by the server before the request deadline: no slot for them
    cut_off: int = 0  # closed by the server once they had been open a while: the deadline
    longest: float = 0.0  # the longest any connection stayed open until the server closed it


@dataclass
class _Conn:
    sock: socket.socket
    source: str
    opened: float
    established: bool = False


def serve(host: str, port: int) -> None:
    server = HealthServer(host, port, lambda: b"metrics\n", lambda: (True, "ok"), lambda: (True, "ok"))
    print("listening", flush=True)
    try:
        sys.stdin.read()  # the test closes our stdin to stop us
    finally:
        server.close()


def flood(
    target: tuple[str, int], sources: list[str], *, per_source: int, seconds: float, cut_after: float
) -> FloodReport:
    """Hold `per_source` connections from each source for `seconds`. A connection the server
    closes after `cut_after` seconds or more counts as cut off, sooner as turned away."""
    report = FloodReport()
    conns: dict[int, _Conn] = {}
    held = {source: 0 for source in sources}  # connections open or opening, per source
    end = time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:

        def close(conn: _Conn) -> None:
            selector.unregister(conn.sock)
            del conns[conn.sock.fileno()]
            conn.sock.close()
            held[conn.source] -= 1

        next_round = time.monotonic()
        while (now := time.monotonic()) < end:
            if now >= next_round:
                next_round = now + ROUND
                for conn in list(conns.values()):
                    if conn.established:
                        with contextlib.suppress(OSError):
                            conn.sock.send(b"E")  # a byte now and then: a per-read timeout never fires
                for source in sources:
                    while held[source] < per_source and report.connects < MAX_CONNECTS:
                        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                        sock.setblocking(False)
                        sock.bind((source, 0))
                        report.connects += 1
                        err = sock.connect_ex(target)
                        if err not in (0, errno.EINPROGRESS):
                            sock.close()
                            report.failed += 1
                            continue
                        conns[sock.fileno()] = _Conn(sock, source, time.monotonic())
                        selector.register(sock, selectors.EVENT_WRITE)
                        held[source] += 1
            for key, _ in selector.select(timeout=max(0.0, min(next_round, end) - time.monotonic())):
                conn = conns[key.fd]
                if not conn.established:
                    if conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        report.failed += 1
                        close(conn)
                        continue
                    conn.established = True
                    conn.opened = time.monotonic()
                    with contextlib.suppress(OSError):
                        conn.sock.send(b"G")  # the first byte of a request that never ends
                    selector.modify(conn.sock, selectors.EVENT_READ)
                    continue
                try:
                    data = conn.sock.recv(4096)
                except OSError:
                    data = b""
                if data:
                    continue  # an answer to a request never finished: not expected, kept open
                lived = time.monotonic() - conn.opened
                report.longest = max(report.longest, lived)
                if lived >= cut_after:
                    report.cut_off += 1
                else:
                    report.turned_away += 1
                close(conn)
        for conn in list(conns.values()):
            close(conn)
    return report


@dataclass
class HeadsReport:
    connects: int = 0  # connections attempted
    failed: int = 0  # never established
    sent_whole: int = 0  # connections that sent every header line before the server closed them
    answers: dict[str, int] = field(default_factory=dict)  # status the server answered with -> connections
    unanswered: int = 0  # closed or reset by the server with no answer read
    longest: float = 0.0  # the longest any connection stayed open until the server closed it


def fat_head() -> bytes:
    """A GET with as many header lines, each as long, as the stock handler takes, without the
    blank line that would end them: it holds all of them while it waits for one more."""
    line = b"X-Fill-%03d: "
    pad = HEADER_LINE_BYTES - len(line % 0) - 2
    fill = b"".join(line % n + b"a" * pad + b"\r\n" for n in range(HEADER_LINES))
    return b"GET /metrics HTTP/1.1\r\n" + fill


def _hold_fat_heads(target: tuple[str, int], source: str, end: float, head: bytes) -> HeadsReport:
    """One slot's client: connect, send `head`, wait for the server to answer or close, again."""
    report = HeadsReport()
    while time.monotonic() < end and report.connects < MAX_CONNECTS:
        report.connects += 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(max(0.1, end - time.monotonic()) + 1)
            sock.bind((source, 0))
            try:
                sock.connect(target)
            except OSError:
                report.failed += 1
                time.sleep(ROUND)
                continue
            opened = time.monotonic()
            answer = b""
            try:
                sock.sendall(head)
                report.sent_whole += 1
            except OSError:
                pass  # closed while sending: the server stopped reading
            with contextlib.suppress(OSError):
                while len(answer) < 64 and (chunk := sock.recv(64)):
                    answer += chunk
        report.longest = max(report.longest, time.monotonic() - opened)
        parts = answer.split(b" ", 2)
        if answer.startswith(b"HTTP/") and len(parts) > 1 and parts[1].isdigit():
            status = parts[1].decode()
            report.answers[status] = report.answers.get(status, 0) + 1
        else:
            report.unanswered += 1
        time.sleep(ROUND / 10)  # a breath between connections: the machine is shared
    return report


def heads(target: tuple[str, int], sources: list[str], *, per_source: int, seconds: float) -> HeadsReport:
    """Hold `per_source` connections from each source for `seconds`, each sending a fat head, a
    thread a connection (each a report of its own, summed at the end)."""
    head = fat_head()
    end = time.monotonic() + seconds
    reports: list[HeadsReport] = []

    def hold(source: str) -> None:
        reports.append(_hold_fat_heads(target, source, end, head))

    clients = [threading.Thread(target=hold, args=(s,), daemon=True) for s in sources for _ in range(per_source)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    total = HeadsReport()
    for part in reports:
        total.connects += part.connects
        total.failed += part.failed
        total.sent_whole += part.sent_whole
        total.unanswered += part.unanswered
        total.longest = max(total.longest, part.longest)
        for status, count in part.answers.items():
            total.answers[status] = total.answers.get(status, 0) + count
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.http_flood")
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve")
    serving.add_argument("host")
    serving.add_argument("port", type=int)
    flooding = commands.add_parser("flood")
    flooding.add_argument("host")
    flooding.add_argument("port", type=int)
    flooding.add_argument("--source", action="append", required=True)
    flooding.add_argument("--per-source", type=int, default=PER_CLIENT)
    flooding.add_argument("--seconds", type=float, required=True)
    flooding.add_argument("--cut-after", type=float, required=True)
    fat = commands.add_parser("heads")
    fat.add_argument("host")
    fat.add_argument("port", type=int)
    fat.add_argument("--source", action="append", required=True)
    fat.add_argument("--per-source", type=int, required=True)
    fat.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.host, args.port)
        return
    if args.command == "heads":
        fat_report = heads((args.host, args.port), args.source, per_source=args.per_source, seconds=args.seconds)
        print(json.dumps(asdict(fat_report)), flush=True)
        return
    report = flood(
        (args.host, args.port), args.source, per_source=args.per_source, seconds=args.seconds, cut_after=args.cut_after
    )
    print(json.dumps(asdict(report)), flush=True)


if __name__ == "__main__":
    main()
