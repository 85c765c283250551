"""Host links over rtnetlink with pyroute2, decoding only the attributes the reaper reads.

pyroute2's full message decode costs about 0.85 ms a link; a node with thousands of veths
would spend seconds there. The dump goes through pyroute2's socket and request machinery
with a parser that reads five attributes straight from the bytes.

A kind that wants links of one link kind only (the bandwidth plugin's IFBs) asks the kernel to
filter the dump by that kind: the kernel then sends only those, so the answer costs next to
nothing however many veths the node has.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyroute2 import AsyncIPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR
from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import RTM_GETLINK, RTM_GETNSID
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.nsidmsg import nsidmsg

IFLA_IFNAME = 3
IFLA_LINK = 5
IFLA_MASTER = 10
IFLA_LINKINFO = 18
IFLA_INFO_KIND = 1
IFLA_LINK_NETNSID = 37
NETNSA_NSID = 1
_NLA_TYPE_MASK = 0x3FFF
_HDR = struct.Struct("=IHHII")
_NLA = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")
_NSID_BATCH = 256
_INFO_WANTED = frozenset({IFLA_INFO_KIND})
# Kernels filter a link dump by IFLA_INFO_KIND since 4.8 at the latest (4.4 does not).
_KIND_FILTER_SINCE = (4, 8)
_NSID_WANTED = frozenset({NETNSA_NSID})  # open pin fds at a time while asking for their nsids


@dataclass(frozen=True)
class RawLink:
    ifindex: int
    name: str
    kind: str | None
    link: int | None
    master: int | None
    link_netnsid: int | None


class _Parsed(dict[str, Any]):
    """The shape pyroute2's request loop expects back from a parser: a dict with a header."""


_WANTED = frozenset({IFLA_IFNAME, IFLA_LINK, IFLA_MASTER, IFLA_LINKINFO, IFLA_LINK_NETNSID})


def _attrs(data: bytes, start: int, end: int, wanted: frozenset[int] = _WANTED) -> dict[int, tuple[int, int]]:
    """Spans of the wanted attributes (type -> (payload start, end)); the rest are skipped."""
    out: dict[int, tuple[int, int]] = {}
    off = start
    unpack = _NLA.unpack_from
    while off + 4 <= end:
        length, atype = unpack(data, off)
        if length < 4 or off + length > end:
            break
        atype &= _NLA_TYPE_MASK
        if atype in wanted:
            out[atype] = (off + 4, off + length)
        off += (length + 3) & ~3
    return out


def _cstring(data: bytes, span: tuple[int, int]) -> str:
    raw = data[span[0] : span[1]]
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_link(data: bytes, offset: int, length: int) -> RawLink:
    """One RTM_NEWLINK message: ifinfomsg (16 bytes) after the netlink header, then attributes."""
    ifindex = _I32.unpack_from(data, offset + 20)[0]
    attrs = _attrs(data, offset + 32, offset + length)
    name = _cstring(data, attrs[IFLA_IFNAME]) if IFLA_IFNAME in attrs else ""
    kind = None
    if IFLA_LINKINFO in attrs:
        start, end = attrs[IFLA_LINKINFO]
        info = _attrs(data, start, end, _INFO_WANTED)
        if IFLA_INFO_KIND in info:
            kind = _cstring(data, info[IFLA_INFO_KIND])
    link = _U32.unpack_from(data, attrs[IFLA_LINK][0])[0] if IFLA_LINK in attrs else None
    master = _U32.unpack_from(data, attrs[IFLA_MASTER][0])[0] if IFLA_MASTER in attrs else None
    netnsid = _I32.unpack_from(data, attrs[IFLA_LINK_NETNSID][0])[0] if IFLA_LINK_NETNSID in attrs else None
    return RawLink(ifindex, name, kind, link, master, netnsid)


def _parse_nsid(data: bytes, offset: int, length: int) -> int | None:
    attrs = _attrs(data, offset + 20, offset + length, _NSID_WANTED)
    if NETNSA_NSID not in attrs:
        return None
    value: int = _I32.unpack_from(data, attrs[NETNSA_NSID][0])[0]
    return value if value >= 0 else None


class _Session:
    def __init__(self, ipr: AsyncIPRoute) -> None:
        self.ipr = ipr

    def parser(self, decode: Any) -> Any:
        def parse(data: bytes, offset: int, length: int) -> Any:
            _, mtype, flags, seq, _ = _HDR.unpack_from(data, offset)
            if mtype in (NLMSG_DONE, NLMSG_ERROR):
                return self.ipr.marshal.parse_one_message(mtype, flags, seq, data, offset, length)
            msg = _Parsed(header={"type": mtype, "flags": flags, "sequence_number": seq, "error": None})
            msg["value"] = decode(data, offset, length)
            return msg

        return parse

    def request(self, msg: Any, decode: Any, msg_type: int, flags: int) -> NetlinkRequest:
        return NetlinkRequest(self.ipr, msg, parser=self.parser(decode), msg_type=msg_type, msg_flags=flags)

    async def dump_links(self) -> list[RawLink]:
        msg = ifinfmsg()
        msg["family"] = 0
        request = self.request(msg, parse_link, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP)
        await request.send()
        return [m["value"] async for m in request.response() if "value" in m]

    async def dump_links_of_kind(self, kind: str, filtered: bool) -> list[RawLink]:
        msg = ifinfmsg()
        msg["family"] = 0
        msg["attrs"] = [("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", kind)]})]
        request = self.request(msg, parse_link, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP)
        await request.send()
        links: list[RawLink] = []
        async with contextlib.aclosing(request.response()) as response:
            async for m in response:
                link = m.get("value")
                if link is None:
                    continue
                if link.kind == kind:
                    links.append(link)
                elif filtered:
                    # A kernel that filters by kind ignores the filter only when it knows no link
                    # type of that name, and then no such link can exist: the rest is not read.
                    break
        return links

    async def nsids(self, paths: list[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for i in range(0, len(paths), _NSID_BATCH):
            chunk = paths[i : i + _NSID_BATCH]
            fds: list[tuple[str, int]] = []
            try:
                for path in chunk:
                    try:
                        fds.append((path, os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)))
                    except OSError:
                        continue
                requests: list[tuple[str, NetlinkRequest]] = []
                data = b""
                for path, fd in fds:
                    msg = nsidmsg()
                    msg["attrs"] = [("NETNSA_FD", fd)]
                    req = self.request(msg, _parse_nsid, RTM_GETNSID, NLM_F_REQUEST | NLM_F_ACK)
                    await req.prepare()
                    data += req.msg.data
                    requests.append((path, req))
                if not requests:
                    continue
                self.ipr.send(data)
                for path, req in requests:
                    # response() frees the request's sequence number when it ends.
                    async for m in req.response():
                        value = m.get("value")
                        if value is not None:
                            found[path] = value
            finally:
                for _, fd in fds:
                    os.close(fd)
        return found


PinChooser = Callable[[list[RawLink]], list[str]]


async def _collect(choose_pins: PinChooser) -> tuple[list[RawLink], dict[str, int]]:
    ipr = AsyncIPRoute()
    try:
        await ipr.setup_endpoint()
        session = _Session(ipr)
        links = await session.dump_links()
        wanted = choose_pins(links)
        nsids = await session.nsids(wanted) if wanted else {}
        return links, nsids
    finally:
        ipr.close()


def dump_links_and_nsids(choose_pins: PinChooser) -> tuple[list[RawLink], dict[str, int]]:
    """All links of this netns, and the nsid (as seen from here) of the pins `choose_pins` picks
    once it has seen the links (asking costs a request per pin, so ask only where needed)."""
    return asyncio.run(_collect(choose_pins))


def dump_links() -> list[RawLink]:
    """All links of this netns, with no nsid look-ups."""
    return dump_links_and_nsids(lambda _links: [])[0]


def kernel_filters_by_kind(release: str | None = None) -> bool:
    """Whether this kernel (or `release`, as uname gives it) is known to filter a link dump by
    kind. Unknown or older: every link comes back, and every one is read."""
    match = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return match is not None and (int(match[1]), int(match[2])) >= _KIND_FILTER_SINCE


async def _collect_kind(kind: str) -> list[RawLink]:
    ipr = AsyncIPRoute()
    try:
        await ipr.setup_endpoint()
        return await _Session(ipr).dump_links_of_kind(kind, kernel_filters_by_kind())
    finally:
        ipr.close()


def dump_links_of_kind(kind: str) -> list[RawLink]:
    """The links of this netns whose link kind is `kind` ("ifb"), the kernel filtering the dump:
    one request, whose answer holds those links only."""
    return asyncio.run(_collect_kind(kind))


async def _delete(indexes: list[int]) -> dict[int, str | None]:
    results: dict[int, str | None] = {}
    ipr = AsyncIPRoute()
    try:
        await ipr.setup_endpoint()
        for index in indexes:
            try:
                await ipr.link("del", index=index)
                results[index] = None
            except Exception as err:  # pyroute2 raises its NetlinkError and OSErrors alike
                code = getattr(err, "code", None)
                results[index] = None if code == errno.ENODEV else str(err)
    finally:
        ipr.close()
    return results


def delete_links(indexes: list[int]) -> dict[int, str | None]:
    """Delete links by index; None for each one gone (or already gone), else the error."""
    return asyncio.run(_delete(indexes))
