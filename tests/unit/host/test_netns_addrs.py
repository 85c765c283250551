"""Reading an address message: the local address of this end (IFA_LOCAL) over a point-to-point
peer's (IFA_ADDRESS), IPv6's only address, and nothing from a message that holds none whole; a
holder's root the kernel denies is named in the error."""

from __future__ import annotations

import errno
import os
import socket
import struct

import pytest

from reaper.host import netns_addrs
from reaper.host.files import describe_oserror
from reaper.host.netns_addrs import IFA_ADDRESS, IFA_LOCAL, Handle, parse_address
from reaper.model import NsKey

RTM_NEWADDR = 20


def _attr(atype: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(family: int, *attributes: bytes) -> bytes:
    body = struct.pack("=BBBBI", family, 32, 0, 0, 3) + b"".join(attributes)
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWADDR, 0, 1, 0) + body


def _parse(data: bytes) -> str | None:
    return parse_address(data, 0, len(data))


def _v4(text: str) -> bytes:
    return socket.inet_pton(socket.AF_INET, text)


def test_the_local_address_is_read_not_the_peers() -> None:
    peer = _message(socket.AF_INET, _attr(IFA_ADDRESS, _v4("10.0.0.1")), _attr(IFA_LOCAL, _v4("10.0.0.5")))
    assert _parse(peer) == "10.0.0.5"
    assert _parse(_message(socket.AF_INET, _attr(IFA_ADDRESS, _v4("10.0.0.6")))) == "10.0.0.6"


def test_an_ipv6_address_is_printed_as_inet_ntop_prints_it() -> None:
    raw = socket.inet_pton(socket.AF_INET6, "fd00:0:0:0:0:0:0:5")
    assert _parse(_message(socket.AF_INET6, _attr(8, b"\0" * 4), _attr(IFA_ADDRESS, raw))) == "fd00::5"


def test_a_message_without_a_whole_address_gives_none() -> None:
    assert _parse(_message(socket.AF_INET)) is None
    assert _parse(_message(socket.AF_INET, _attr(IFA_LOCAL, b"\x0a\x00\x00"))) is None  # 3 bytes for IPv4
    assert _parse(_message(socket.AF_PACKET, _attr(IFA_ADDRESS, b"\x0a\x00\x00\x05"))) is None
    assert parse_address(_message(socket.AF_INET), 0, 20) is None, "a message too short for its header"
    cut = _message(socket.AF_INET, _attr(IFA_LOCAL, _v4("10.0.0.5")))
    assert parse_address(cut, 0, len(cut) - 4) is None, "an attribute past the message is not read"


def test_setns_is_os_setns_where_python_has_it() -> None:
    assert (
        (netns_addrs._setns is os.setns) if hasattr(os, "setns") else (netns_addrs._setns is netns_addrs._setns_ctypes)
    )


def test_a_holders_root_the_reaper_may_not_look_at_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount seen through a task the kernel's ptrace access check keeps the reaper from (a
    protected init's threads): the error says whose root was denied, not only Permission denied;
    a denial beneath that root is the kernel's word alone."""

    def denied(root: str, path: str) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", root)

    monkeypatch.setattr(netns_addrs, "open_path_in_root", denied)
    handle = Handle("/run/netns/cni-1", pinned=True, beneath="/proc/66/root")
    with pytest.raises(OSError) as raised:
        netns_addrs._open_checked(handle, NsKey(4, 1))
    assert describe_oserror(raised.value) == "Permission denied: /proc/66/root, a task the reaper may not look at"

    def denied_beneath(root: str, path: str) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", "run/netns/cni-1")

    monkeypatch.setattr(netns_addrs, "open_path_in_root", denied_beneath)
    with pytest.raises(OSError) as raised:
        netns_addrs._open_checked(handle, NsKey(4, 1))
    assert describe_oserror(raised.value) == "Permission denied"
