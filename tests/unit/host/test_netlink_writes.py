"""The one netlink writer (reaper/host/netlink.py): each delete is its own acknowledged request,
answered for alone, and a socket that fails is that request's error and every later one's,
never an exception that hides the deletes already done. The kernel's answers are played back,
so this runs without root; tests/node/test_netlink_writes.py drives a real kernel."""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from reaper.host import netlink
from reaper.host.netlink import RawRule, delete_links, delete_rules

_HDR = struct.Struct("=IHHII")
Answer = int | OSError
# Indexes no host has: should a writer ever bypass the played-back kernel, it deletes nothing.
_NO_SUCH_LINKS = (2_000_000_007, 2_000_000_008, 2_000_000_009)


class _Sock:
    def send(self, data: bytes) -> int:
        return len(data)


class _Kernel:
    """Answers each request with the next of `answers`: an error code, or an OSError raised."""

    def __init__(self, answers: list[Answer]) -> None:
        self.pending = list(answers)
        self.asked: list[tuple[int, int, bytes]] = []
        self.sock = _Sock()

    def __call__(self) -> _Kernel:
        return self

    def __enter__(self) -> _Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def message(self, mtype: int, flags: int, body: bytes) -> tuple[int, bytes]:
        self.asked.append((mtype, flags, body))
        return len(self.asked), b""

    def answers(self) -> Iterator[tuple[bytes, int, int, int, int]]:
        answer = self.pending.pop(0)
        if isinstance(answer, OSError):
            raise answer
        seq = len(self.asked)
        yield _HDR.pack(20, netlink.NLMSG_DONE, 0, seq - 1, 0) + b"\0" * 4, 0, 20, netlink.NLMSG_DONE, seq - 1
        data = _HDR.pack(20, netlink.NLMSG_ERROR, 0, seq, 0) + struct.pack("=i", -answer)
        yield data, 0, len(data), netlink.NLMSG_ERROR, seq


def _kernel(monkeypatch: pytest.MonkeyPatch, answers: list[Answer]) -> _Kernel:
    kernel = _Kernel(answers)
    monkeypatch.setattr(netlink, "Netlink", kernel)
    return kernel


def _rule(priority: int) -> RawRule:
    fields: dict[str, Any] = {"tos": 0, "flags": 0, "dst": None, "dst_len": 0, "suppress_prefixlen": None}
    return RawRule(family=socket.AF_INET, priority=priority, table=1000, action=1, src="10.0.0.5", src_len=32, **fields)


def test_each_link_delete_is_an_acknowledged_request_answered_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _kernel(monkeypatch, [0, errno.ENODEV, errno.EPERM])
    a, b, c = _NO_SUCH_LINKS
    assert delete_links([a, b, c]) == {a: None, b: None, c: "Operation not permitted"}
    assert [(mtype, flags) for mtype, flags, _ in kernel.asked] == [(netlink.RTM_DELLINK, 0x5)] * 3
    assert [struct.unpack_from("=BxHiII", body)[2] for _, _, body in kernel.asked] == [a, b, c]


def test_a_rule_already_gone_is_done_and_another_error_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _kernel(monkeypatch, [errno.ENOENT, errno.EACCES])
    assert delete_rules([_rule(512), _rule(1536)]) == [None, "Permission denied"]
    assert [(mtype, flags) for mtype, flags, _ in kernel.asked] == [(netlink.RTM_DELRULE, 0x5)] * 2


def test_a_failed_socket_fails_that_delete_and_the_rest_never_the_ones_done(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _kernel(monkeypatch, [0, TimeoutError("timed out")])
    assert delete_rules([_rule(512), _rule(1536), _rule(2048)]) == [None, "netlink: timed out", "netlink: timed out"]
    assert len(kernel.asked) == 2  # nothing more is asked on a socket that failed
