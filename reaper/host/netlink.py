"""Host links and policy rules over rtnetlink on a plain socket: the reaper's one netlink reader
and its one writer.

A dump is decoded from the bytes, only the attributes used; nsids are asked in batches matched by
sequence number. Every dump is bounded (DumpLimits) and over its bound an error (DumpOverBound);
one the kernel flags as interrupted is asked again, then an error (DumpInterrupted), never a
partial inventory. Every write is a delete of a fixed layout, acknowledged alone. Why by hand
and not pyroute2: DEVELOPMENT.md, "Netlink: one reader, one writer"; the rest: docs/design.md,
"In depth: mounts, netlink and /proc".
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import struct
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import TypeVar

from msgspec import Struct

T = TypeVar("T")

NETLINK_ROUTE = 0
TIMEOUT = 30.0  # seconds the kernel gets to answer one read
RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_NEWNSID = 88
RTM_GETNSID = 90
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_DUMP_INTR = 0x10
DUMP_ATTEMPTS = 4  # asks of a dump the kernel keeps flagging as interrupted
MAX_DUMP_BYTES = 64 * 1024 * 1024  # bytes the kernel may answer one dump with
MAX_DUMP_ITEMS = 200_000  # messages the kernel may answer one dump with
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
IFLA_IFNAME = 3
IFLA_LINK = 5
IFLA_MASTER = 10
IFLA_LINKINFO = 18
IFLA_INFO_KIND = 1
IFLA_LINK_NETNSID = 37
NETNSA_NSID = 1
NETNSA_FD = 3
_NLA_TYPE_MASK = 0x3FFF
_HDR = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_NLA = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")
_NSID_BATCH = 256  # open pin fds at a time while asking for their nsids
_RECV_BYTES = 1 << 18
_INFO_WANTED = frozenset({IFLA_INFO_KIND})
# Kernels filter a link dump by IFLA_INFO_KIND since 4.8 at the latest (4.4 does not).
_KIND_FILTER_SINCE = (4, 8)
_NSID_WANTED = frozenset({NETNSA_NSID})


class RawLink(Struct, frozen=True, kw_only=True):
    ifindex: int
    name: str
    kind: str | None
    link: int | None
    master: int | None
    link_netnsid: int | None


_WANTED = frozenset({IFLA_IFNAME, IFLA_LINK, IFLA_MASTER, IFLA_LINKINFO, IFLA_LINK_NETNSID})


def attrs(
    data: bytes | bytearray, start: int, end: int, wanted: Container[int] = _WANTED
) -> dict[int, tuple[int, int]]:
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


def cstring(data: bytes | bytearray, span: tuple[int, int]) -> str:
    raw = bytes(data[span[0] : span[1]])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_link(data: bytes | bytearray, offset: int, length: int) -> RawLink:
    """One RTM_NEWLINK message: ifinfomsg (16 bytes) after the header, then attributes."""
    ifindex = _I32.unpack_from(data, offset + 20)[0]
    at = attrs(data, offset + 32, offset + length)
    name = cstring(data, at[IFLA_IFNAME]) if IFLA_IFNAME in at else ""
    info = attrs(data, *at[IFLA_LINKINFO], _INFO_WANTED) if IFLA_LINKINFO in at else {}
    kind = cstring(data, info[IFLA_INFO_KIND]) if IFLA_INFO_KIND in info else None
    link = _U32.unpack_from(data, at[IFLA_LINK][0])[0] if IFLA_LINK in at else None
    master = _U32.unpack_from(data, at[IFLA_MASTER][0])[0] if IFLA_MASTER in at else None
    netnsid = _I32.unpack_from(data, at[IFLA_LINK_NETNSID][0])[0] if IFLA_LINK_NETNSID in at else None
    return RawLink(ifindex=ifindex, name=name, kind=kind, link=link, master=master, link_netnsid=netnsid)


def _parse_nsid(data: bytes | bytearray, offset: int, length: int) -> int | None:
    at = attrs(data, offset + 20, offset + length, _NSID_WANTED)
    if NETNSA_NSID not in at:
        return None
    value: int = _I32.unpack_from(data, at[NETNSA_NSID][0])[0]
    return value if value >= 0 else None


def _messages(data: bytes | bytearray, size: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(offset, length, type, flags, sequence) of each message in the first `size` bytes read."""
    off = 0
    while off + _HDR.size <= size:
        length, mtype, flags, seq, _ = _HDR.unpack_from(data, off)
        if length < _HDR.size or off + length > size:
            raise OSError(errno.EBADMSG, "malformed netlink message")
        yield off, length, mtype, flags, seq
        off += (length + 3) & ~3


def _attr(atype: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = _NLA.pack(4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


class Netlink:
    """One netlink socket (rtnetlink unless told) in this process's netns; no answer within
    `timeout` seconds is an OSError."""

    def __init__(self, protocol: int = NETLINK_ROUTE, timeout: float = TIMEOUT) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
        self._seq = count(1)
        self._buf = bytearray(_RECV_BYTES)
        try:
            self.sock.settimeout(timeout)
            self.sock.bind((0, 0))
        except OSError:
            self.sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def message(self, mtype: int, flags: int, body: bytes) -> tuple[int, bytes]:
        seq = next(self._seq)
        return seq, _HDR.pack(_HDR.size + len(body), mtype, flags, seq, 0) + body

    def answers(self) -> Iterator[tuple[bytearray, int, int, int, int]]:
        """(buffer, offset, length, type, sequence) of each message received, forever; each read reuses the buffer."""
        view = memoryview(self._buf)
        while True:
            for off, length, mtype, _, seq in _messages(self._buf, self.sock.recv_into(view)):
                yield self._buf, off, length, mtype, seq

    def dump(self, mtype: int, body: bytes, decode: Callable[[bytes, int, int], T]) -> Iterator[T]:
        """Each answer to a dump request, decoded (dump_kept)."""
        return iter(dump_kept(self, mtype, body, decode))


class DumpInterrupted(OSError):
    """The kernel flagged every answer to a dump as interrupted (NLM_F_DUMP_INTR)."""


class DumpOverBound(OSError):
    """A dump over its bytes, messages or deadline: not read to its end."""


@dataclass(frozen=True, kw_only=True)
class DumpLimits:
    """Bytes and messages of one ask of a dump; a deadline on `clock` for all asks, looked at between reads."""

    max_bytes: int = MAX_DUMP_BYTES
    max_items: int = MAX_DUMP_ITEMS
    deadline: float | None = None
    clock: Callable[[], float] = field(default=time.monotonic)


DEFAULT_LIMITS = DumpLimits()


def _answers(nl: Netlink, seq: int, limits: DumpLimits) -> Iterator[tuple[bytes, int, int, int, int, int]]:
    """(read, offset, length, type, flags, sequence) of each message received until the answer to
    `seq` ends (NLMSG_DONE or NLMSG_ERROR, yielded too); DumpOverBound past `limits`."""
    taken = items = 0
    while True:
        if limits.deadline is not None:
            left = limits.deadline - limits.clock()
            if left <= 0:
                raise DumpOverBound(errno.ETIMEDOUT, "the dump was not read whole by the deadline")
            timeout = nl.sock.gettimeout()
            if timeout is None or left < timeout:
                nl.sock.settimeout(left)  # the next read waits no longer than what is left
        data = nl.sock.recv(_RECV_BYTES)
        ours, ended = 0, False
        for off, length, atype, flags, aseq in _messages(data, len(data)):
            if aseq == seq:
                ours += 1
                ended = ended or atype in (NLMSG_DONE, NLMSG_ERROR)
            yield data, off, length, atype, flags, aseq
        taken += len(data)
        items += ours
        if taken > limits.max_bytes or items > limits.max_items:
            raise DumpOverBound(
                errno.EFBIG,
                f"the dump is over its bound ({limits.max_items} messages, {limits.max_bytes} bytes): not read whole",
            )
        if ended:
            return


def dump_kept(
    nl: Netlink,
    mtype: int,
    body: bytes,
    keep: Callable[[bytes, int, int], T | None],
    limits: DumpLimits = DEFAULT_LIMITS,
) -> list[T]:
    """What `keep` makes of each answer, but None, decoded read by read so only that stays in
    memory. DumpInterrupted after DUMP_ATTEMPTS interrupted answers; DumpOverBound past `limits`;
    OSError when refused."""
    for _ in range(DUMP_ATTEMPTS):
        seq, msg = nl.message(mtype, NLM_F_REQUEST | NLM_F_DUMP, body)
        nl.sock.send(msg)
        kept: list[T] = []
        interrupted = False
        for data, off, length, atype, flags, aseq in _answers(nl, seq, limits):
            if aseq != seq:
                continue
            interrupted = interrupted or bool(flags & NLM_F_DUMP_INTR)
            if atype == NLMSG_ERROR:
                code = -_I32.unpack_from(data, off + _HDR.size)[0]
                if code:
                    raise OSError(code, os.strerror(code))
            elif atype != NLMSG_DONE and (value := keep(data, off, length)) is not None:
                kept.append(value)
        if not interrupted:
            return kept
    raise DumpInterrupted(
        errno.EAGAIN, f"the kernel interrupted the dump {DUMP_ATTEMPTS} times (it changed while being read)"
    )


def links_of(nl: Netlink, body: bytes) -> list[RawLink]:
    return dump_kept(nl, RTM_GETLINK, body, parse_link)


def _open_namespace(path: str) -> tuple[os.stat_result, int] | None:
    """The pin's stat and an fd to ask its nsid with; None when no regular file. Opened for
    reading only once its O_PATH fd (no symlink followed) shows it regular: never a FIFO."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return st, os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    finally:
        os.close(fd)


def _nsids(nl: Netlink, paths: list[str]) -> dict[str, tuple[os.stat_result, int]]:
    found: dict[str, tuple[os.stat_result, int]] = {}
    for i in range(0, len(paths), _NSID_BATCH):
        fds: list[int] = []
        try:
            asked: dict[int, tuple[str, os.stat_result]] = {}
            batch = []
            for path in paths[i : i + _NSID_BATCH]:
                try:
                    pin = _open_namespace(path)
                except OSError:
                    continue
                if pin is None:
                    continue
                st, fd = pin
                fds.append(fd)
                # rtgenmsg (family, padded to 4 bytes), then the pin's fd
                seq, msg = nl.message(RTM_GETNSID, NLM_F_REQUEST, b"\0\0\0\0" + _attr(NETNSA_FD, _U32.pack(fd)))
                asked[seq] = (path, st)
                batch.append(msg)
            if not batch:
                continue
            nl.sock.send(b"".join(batch))
            for data, off, length, mtype, seq in nl.answers():
                pin_of = asked.pop(seq, None)
                if pin_of is not None and mtype == RTM_NEWNSID:
                    nsid = _parse_nsid(data, off, length)
                    if nsid is not None:
                        found[pin_of[0]] = (pin_of[1], nsid)
                if not asked:
                    break  # every request answered (an error answers too)
        finally:
            for fd in fds:
                os.close(fd)
    return found


IFLA_EXT_MASK = 29
RTEXT_FILTER_SKIP_STATS = 1 << 3
# Every link, without its counters (a fifth of each answer; older kernels ignore the flag).
_ALL_LINKS = _IFINFO.pack(0, 0, 0, 0, 0) + _attr(IFLA_EXT_MASK, _U32.pack(RTEXT_FILTER_SKIP_STATS))


def nsids_of(paths: list[str]) -> dict[str, tuple[os.stat_result, int]]:
    """The nsid (as seen from here) of the namespace pinned at each path, with the stat of the
    one asked (the pin may have changed since); none for no regular file or no namespace."""
    with Netlink() as nl:
        return _nsids(nl, paths)


def dump_links() -> list[RawLink]:
    """All links of this netns (no nsid looked up)."""
    with Netlink() as nl:
        return links_of(nl, _ALL_LINKS)


def kernel_filters_by_kind(release: str | None = None) -> bool:
    """Whether this kernel (or `release`) is known to filter a link dump by kind."""
    match = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return match is not None and (int(match[1]), int(match[2])) >= _KIND_FILTER_SINCE


def links_of_kind(kind: str, filtered: bool) -> list[RawLink]:
    """The links of kind `kind`, the dump asked to be filtered by it; `filtered`: this kernel
    honours the filter, so a link of another kind ends the answer."""
    body = _ALL_LINKS + _attr(IFLA_LINKINFO, _attr(IFLA_INFO_KIND, kind.encode() + b"\0"))
    found: list[RawLink] = []
    with Netlink() as nl:
        for link in links_of(nl, body):
            if link.kind == kind:
                found.append(link)
            elif filtered:
                # Ignored only for a link type the kernel does not know, so none exists.
                break
    return found


def dump_links_of_kind(kind: str) -> list[RawLink]:
    return links_of_kind(kind, kernel_filters_by_kind())


def _acknowledged(nl: Netlink, mtype: int, body: bytes) -> int:
    """The error code (0: done) the kernel acknowledges one request with."""
    seq, msg = nl.message(mtype, NLM_F_REQUEST | NLM_F_ACK, body)
    nl.sock.send(msg)
    acks = (
        data[off + _HDR.size : off + length]
        for data, off, length, atype, aseq in nl.answers()
        if aseq == seq and atype == NLMSG_ERROR
    )
    return -int(_I32.unpack_from(next(acks))[0])


def _delete_each(bodies: list[bytes], mtype: int, gone: int) -> list[str | None]:
    """Send each delete, one acknowledged request at a time; None for each done or already gone
    (error `gone`), else the error. A failing socket is that one's error and every later one's."""
    results: list[str | None] = []
    with Netlink() as nl:
        for body in bodies:
            try:
                code = _acknowledged(nl, mtype, body)
            except OSError as err:
                return results + [f"netlink: {err}"] * (len(bodies) - len(results))
            results.append(None if code in (0, gone) else os.strerror(code))
    return results


def delete_links(indexes: list[int]) -> dict[int, str | None]:
    """Delete links by index (RTM_DELLINK), the caller having compared each just before; None for
    each gone (or already: ENODEV), else the error."""
    bodies = [_IFINFO.pack(socket.AF_UNSPEC, 0, index, 0, 0) for index in indexes]
    return dict(zip(indexes, _delete_each(bodies, RTM_DELLINK, errno.ENODEV), strict=True))


# ------------------------------------------------------------------------------ policy rules

RTM_NEWRULE = 32
RTM_DELRULE = 33
RTM_GETRULE = 34
FRA_DST = 1
FRA_SRC = 2
FRA_PRIORITY = 6
FRA_SUPPRESS_PREFIXLEN = 14
FRA_TABLE = 15
FRA_PAD = 18
FRA_PROTOCOL = 21
FR_ACT_TO_TBL = 1
_FIB_RULE_HDR = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, 2 pad, action, flags
ADDRESS_SIZE: dict[int, int] = {socket.AF_INET: 4, socket.AF_INET6: 16}  # bytes, by family
# Sent with every rule whatever it selects, besides those read: none changes what it selects.
_RULE_QUIET = frozenset({FRA_PAD, FRA_PROTOCOL})
_RULE_READ = frozenset({FRA_DST, FRA_SRC, FRA_PRIORITY, FRA_TABLE, FRA_SUPPRESS_PREFIXLEN})
_EVERY_TYPE = range(_NLA_TYPE_MASK + 1)


class RawRule(Struct, frozen=True, kw_only=True):
    """One routing policy rule, as the kernel dumps it: what it selects and where it sends."""

    family: int  # AF_INET or AF_INET6
    priority: int
    table: int  # FRA_TABLE when sent (tables above 255), else the header's
    action: int
    flags: int  # FIB_RULE_INVERT (`not`) and the like
    tos: int
    src: str | None  # the selector's address as inet_ntop prints it, or None: from all
    src_len: int
    dst: str | None
    dst_len: int
    suppress_prefixlen: int | None  # None when not sent or -1 (no suppression)
    other: tuple[int, ...] = ()  # every other attribute (iif, fwmark, goto...): it selects more


def _address(data: bytes | bytearray, span: tuple[int, int] | None, family: int) -> str | None:
    if span is None or span[1] - span[0] != ADDRESS_SIZE.get(family):
        return None
    return socket.inet_ntop(family, bytes(data[span[0] : span[1]]))


def parse_rule(data: bytes | bytearray, offset: int, length: int) -> RawRule:
    """One RTM_NEWRULE message: fib_rule_hdr (12 bytes) after the header, then attributes."""
    family, dst_len, src_len, tos, table, _, _, action, flags = _FIB_RULE_HDR.unpack_from(data, offset + _HDR.size)
    at = attrs(data, offset + _HDR.size + _FIB_RULE_HDR.size, offset + length, _EVERY_TYPE)
    if FRA_TABLE in at:
        table = _U32.unpack_from(data, at[FRA_TABLE][0])[0]
    priority = _U32.unpack_from(data, at[FRA_PRIORITY][0])[0] if FRA_PRIORITY in at else 0
    suppress = _I32.unpack_from(data, at[FRA_SUPPRESS_PREFIXLEN][0])[0] if FRA_SUPPRESS_PREFIXLEN in at else -1
    return RawRule(
        family=family,
        priority=priority,
        table=table,
        action=action,
        flags=flags,
        tos=tos,
        src=_address(data, at.get(FRA_SRC), family),
        src_len=src_len,
        dst=_address(data, at.get(FRA_DST), family),
        dst_len=dst_len,
        suppress_prefixlen=None if suppress == -1 else suppress,
        other=tuple(atype for atype in at if atype not in _RULE_READ and atype not in _RULE_QUIET),
    )


def dump_rules() -> list[RawRule]:
    """Every IPv4 and IPv6 policy rule of this netns: one dump (family AF_UNSPEC answers both)."""
    body = _FIB_RULE_HDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)
    with Netlink() as nl:
        return [r for r in dump_kept(nl, RTM_GETRULE, body, parse_rule) if r.family in ADDRESS_SIZE]


def _rule_request(rule: RawRule) -> bytes:
    """A request naming `rule` by the fields the kernel compares to find the rule to delete."""
    body = _FIB_RULE_HDR.pack(rule.family, rule.dst_len, rule.src_len, rule.tos, 0, 0, 0, rule.action, rule.flags)
    body += _attr(FRA_PRIORITY, _U32.pack(rule.priority)) + _attr(FRA_TABLE, _U32.pack(rule.table))
    if rule.src is not None:
        body += _attr(FRA_SRC, socket.inet_pton(rule.family, rule.src))
    if rule.dst is not None:
        body += _attr(FRA_DST, socket.inet_pton(rule.family, rule.dst))
    return body


def delete_rules(rules: list[RawRule]) -> list[str | None]:
    """Delete each rule by what it selects; None for each gone (or already: ENOENT), else the error."""
    return _delete_each([_rule_request(rule) for rule in rules], RTM_DELRULE, errno.ENOENT)
