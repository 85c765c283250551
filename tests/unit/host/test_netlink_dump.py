"""A dump the kernel flags as interrupted (NLM_F_DUMP_INTR) is asked again, and after a few
such answers is an error: never a partial list of links. The kernel's answers are played back
from bytes, so this runs without root."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from reaper.host import netlink
from reaper.host.netlink import DUMP_ATTEMPTS, DumpInterrupted, links_of

_HDR = struct.Struct("=IHHII")


def _link(seq: int, index: int, name: str, flags: int) -> bytes:
    name_attr = struct.pack("=HH", 4 + len(name) + 1, netlink.IFLA_IFNAME) + name.encode() + b"\0"
    name_attr += b"\0" * (-len(name_attr) % 4)
    body = struct.pack("=BxHiII", 0, 1, index, 0, 0) + name_attr
    return _HDR.pack(_HDR.size + len(body), netlink.RTM_NEWLINK, flags, seq, 0) + body


def _done(seq: int, flags: int) -> bytes:
    return _HDR.pack(_HDR.size + 4, netlink.NLMSG_DONE, flags, seq, 0) + b"\0\0\0\0"


class _Socket:
    def __init__(self, answers: Iterator[bytes]) -> None:
        self.answers = answers
        self.sent = 0

    def send(self, data: bytes) -> int:
        self.sent += 1
        return len(data)

    def recv(self, size: int) -> bytes:
        return next(self.answers)


class _Kernel:
    """A netlink socket whose dumps are answered, in turn, by `interrupted` (each a bool): two
    links, flagged NLM_F_DUMP_INTR on an interrupted turn."""

    def __init__(self, interrupted: list[bool]) -> None:
        self.seq = 0
        self.sock = _Socket(self._answers(interrupted))

    def message(self, mtype: int, flags: int, body: bytes) -> tuple[int, bytes]:
        self.seq += 1
        return self.seq, b""

    def _answers(self, interrupted: list[bool]) -> Iterator[bytes]:
        for intr in interrupted:
            flags = netlink.NLM_F_DUMP_INTR if intr else 0
            yield _link(self.seq, 1, "lo", 0) + _link(self.seq, 2, "eth0", flags)
            yield _done(self.seq, flags)


def test_an_interrupted_dump_is_asked_again_and_the_whole_one_is_read() -> None:
    kernel = _Kernel([True, True, False])
    links = links_of(kernel, b"")  # type: ignore[arg-type]
    assert kernel.sock.sent == 3
    assert [link.name for link in links] == ["lo", "eth0"]


def test_a_dump_interrupted_every_time_is_an_error_never_a_partial_list() -> None:
    kernel = _Kernel([True] * DUMP_ATTEMPTS)
    with pytest.raises(DumpInterrupted):
        links_of(kernel, b"")  # type: ignore[arg-type]
    assert kernel.sock.sent == DUMP_ATTEMPTS


def test_links_of_a_netlink_socket_are_read_through_the_same_retry() -> None:
    assert [link.ifindex for link in links_of(_Kernel([True, False]), b"")] == [1, 2]  # type: ignore[arg-type]
    with pytest.raises(DumpInterrupted):
        links_of(_Kernel([True] * DUMP_ATTEMPTS), b"")  # type: ignore[arg-type]


class _EndlessKernel:
    """A netlink socket whose dump answer never ends: each read holds `per_read` links and no
    NLMSG_DONE. It counts the reads it was asked for."""

    def __init__(self, per_read: int = 100) -> None:
        self.seq = 0
        self.reads = 0
        self.per_read = per_read
        self.timeout: float | None = 30.0
        self.sock = self

    def message(self, mtype: int, flags: int, body: bytes) -> tuple[int, bytes]:
        self.seq += 1
        return self.seq, b""

    def send(self, data: bytes) -> int:
        return len(data)

    def gettimeout(self) -> float | None:
        return self.timeout

    def settimeout(self, value: float | None) -> None:
        self.timeout = value

    def recv(self, size: int) -> bytes:
        self.reads += 1
        return b"".join(_link(self.seq, i, f"veth{i}", 0) for i in range(self.per_read))


def test_a_dump_over_its_bound_is_an_error_never_read_to_its_end() -> None:
    """A namespace whose owner configured without end: the read stops once the answer passes
    its message or byte bound, whichever comes first."""
    by_items = _EndlessKernel()
    limits = netlink.DumpLimits(max_items=1_000)
    with pytest.raises(netlink.DumpOverBound, match="over its bound"):
        netlink.dump_kept(by_items, netlink.RTM_GETLINK, b"", netlink.parse_link, limits)  # type: ignore[arg-type]
    assert by_items.reads == 11
    by_bytes = _EndlessKernel()
    limits = netlink.DumpLimits(max_bytes=10 * len(_link(1, 1, "veth1", 0)) * 100)
    with pytest.raises(netlink.DumpOverBound):
        netlink.dump_kept(by_bytes, netlink.RTM_GETLINK, b"", netlink.parse_link, limits)  # type: ignore[arg-type]
    assert by_bytes.reads <= 11


def test_the_reader_stops_at_the_deadline_between_reads() -> None:
    """The clock is looked at before each read, and no read waits past what is left."""
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each look at the clock is a second later
        return now[0]

    kernel = _EndlessKernel(per_read=1)
    limits = netlink.DumpLimits(deadline=5.5, clock=clock)
    with pytest.raises(netlink.DumpOverBound, match="deadline"):
        netlink.dump_kept(kernel, netlink.RTM_GETLINK, b"", netlink.parse_link, limits)  # type: ignore[arg-type]
    assert kernel.reads == 5
    assert kernel.timeout is not None and kernel.timeout <= 1.5


def test_only_what_is_kept_of_a_dump_stays_and_an_interrupted_ask_keeps_nothing() -> None:
    def eth0(data: bytes, offset: int, length: int) -> str | None:
        link = netlink.parse_link(data, offset, length)
        return link.name if link.ifindex == 2 else None

    kernel = _Kernel([True, False])
    kept = netlink.dump_kept(kernel, netlink.RTM_GETLINK, b"", eth0)  # type: ignore[arg-type]
    assert kept == ["eth0"] and kernel.sock.sent == 2
