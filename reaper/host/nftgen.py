"""The nftables ruleset's generation in this netns: a number the kernel moves on at every
commit that changes any table (`nf_tables_commit` bumps `base_seq`; NFT_MSG_GETGEN reads it).
iptables-nft writes through such commits too, so while the number stays, `iptables-nft-save`
prints the same rules. iptables-legacy's tables are not nftables: they have no generation."""

from __future__ import annotations

import socket
import struct

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_NEWGEN = 15
NFT_MSG_GETGEN = 16
NFTA_GEN_ID = 1
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
TIMEOUT = 5.0  # seconds the kernel gets to answer
_HDR = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_NFGEN = struct.Struct("=BBH")  # nfgenmsg: family, version, resource id (big-endian, 0 here)
_NLA = struct.Struct("=HH")
_NLA_TYPE_MASK = 0x3FFF
_BE32 = struct.Struct(">I")
_SEQ = 1


def ruleset_generation(timeout: float = TIMEOUT) -> int | None:
    """The generation, or None when it cannot be known (no nf_tables, no answer, an answer
    that is not one): then nothing may be taken as unchanged."""
    request = _HDR.pack(
        _HDR.size + _NFGEN.size, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN, NLM_F_REQUEST, _SEQ, 0
    ) + _NFGEN.pack(socket.AF_UNSPEC, 0, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER) as sock:
            sock.settimeout(timeout)
            sock.bind((0, 0))
            sock.send(request)
            return generation_in(sock.recv(4096))
    except OSError:
        return None


def generation_in(data: bytes) -> int | None:
    """NFTA_GEN_ID of the kernel's NEWGEN answer to our request, or None."""
    if len(data) < _HDR.size + _NFGEN.size:
        return None
    length, msg_type, _, seq, _ = _HDR.unpack_from(data)
    if msg_type != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN or seq != _SEQ or not _HDR.size < length <= len(data):
        return None
    at = _HDR.size + _NFGEN.size
    while at + _NLA.size <= length:
        nla_len, nla_type = _NLA.unpack_from(data, at)
        if nla_len < _NLA.size or at + nla_len > length:
            return None
        if nla_type & _NLA_TYPE_MASK == NFTA_GEN_ID and nla_len == _NLA.size + _BE32.size:
            generation: int = _BE32.unpack_from(data, at + _NLA.size)[0]
            return generation
        at += (nla_len + 3) & ~3
    return None
