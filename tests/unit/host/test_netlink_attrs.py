"""Reading a link message's attributes: only the five used, the rest skipped; an attribute that
runs past the message ends the reading, never a read past it."""

from __future__ import annotations

import struct

from reaper.host import netlink
from reaper.host.netlink import RawLink, parse_link


def _attr(atype: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(*attributes: bytes, ifindex: int = 7) -> bytes:
    body = struct.pack("=BxHiII", 0, 1, ifindex, 0, 0) + b"".join(attributes)
    return struct.pack("=IHHII", 16 + len(body), netlink.RTM_NEWLINK, 0, 1, 0) + body


VETH = (
    _attr(netlink.IFLA_IFNAME, b"veth1234\0"),
    _attr(13, b"\0\0\0\0"),  # a txqlen: skipped
    _attr(netlink.IFLA_MASTER, struct.pack("=I", 3)),
    _attr(netlink.IFLA_LINKINFO, _attr(netlink.IFLA_INFO_KIND, b"veth\0") + _attr(2, b"\0" * 8)),
    _attr(netlink.IFLA_LINK_NETNSID, struct.pack("=i", 5)),
    _attr(netlink.IFLA_LINK, struct.pack("=I", 2)),
)


def _parse(data: bytes) -> RawLink:
    return parse_link(data, 0, len(data))


def test_the_five_attributes_are_read_and_the_rest_skipped() -> None:
    assert _parse(_message(*VETH)) == RawLink(ifindex=7, name="veth1234", kind="veth", link=2, master=3, link_netnsid=5)


def test_a_link_without_some_attributes_has_none_for_them() -> None:
    lo = _message(_attr(netlink.IFLA_IFNAME, b"lo\0"), _attr(13, b"\0\0\0\0"), ifindex=1)
    assert _parse(lo) == RawLink(ifindex=1, name="lo", kind=None, link=None, master=None, link_netnsid=None)


def test_an_attribute_running_past_the_message_ends_the_reading() -> None:
    torn = _message(_attr(netlink.IFLA_IFNAME, b"eth0\0"), struct.pack("=HH", 200, netlink.IFLA_LINK) + b"\1\0\0\0")
    assert _parse(torn) == RawLink(ifindex=7, name="eth0", kind=None, link=None, master=None, link_netnsid=None)
