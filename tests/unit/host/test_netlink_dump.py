"""A dump the kernel flags as interrupted (NLM_F_DUMP_INTR) is asked again, and after a few
such answers is an error: never a partial list of links. The kernel's answers are played back
from bytes, so this runs without root."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from reaper.host import netlink
from reaper.host.netlink import DUMP_ATTEMPTS, DumpInterrupted, dump_raw, links_of

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
    seq, reads = dump_raw(kernel, netlink.RTM_GETLINK, b"")  # type: ignore[arg-type]
    assert kernel.sock.sent == 3
    assert [link.name for link in netlink.decode_raw(seq, reads, netlink.parse_link)] == ["lo", "eth0"]


def test_a_dump_interrupted_every_time_is_an_error_never_a_partial_list() -> None:
    kernel = _Kernel([True] * DUMP_ATTEMPTS)
    with pytest.raises(DumpInterrupted):
        dump_raw(kernel, netlink.RTM_GETLINK, b"")  # type: ignore[arg-type]
    assert kernel.sock.sent == DUMP_ATTEMPTS


def test_links_of_a_netlink_socket_are_read_through_the_same_retry() -> None:
    assert [link.ifindex for link in links_of(_Kernel([True, False]), b"")] == [1, 2]  # type: ignore[arg-type]
    with pytest.raises(DumpInterrupted):
        links_of(_Kernel([True] * DUMP_ATTEMPTS), b"")  # type: ignore[arg-type]
