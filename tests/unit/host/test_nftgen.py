"""Reading the kernel's NFT_MSG_NEWGEN answer: the number, or None for anything else."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from reaper.host.nftgen import NFNL_SUBSYS_NFTABLES, NFT_MSG_NEWGEN, NLMSG_ERROR, generation_in

NEWGEN = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN


def answer(attrs: bytes, msg_type: int = NEWGEN, seq: int = 1, length: int | None = None) -> bytes:
    body = struct.pack("=BBH", 0, 0, 0) + attrs
    return struct.pack("=IHHII", length if length is not None else 16 + len(body), msg_type, 0, seq, 0) + body


def attr(nla_type: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), nla_type) + payload
    return raw + b"\0" * (-len(raw) % 4)


def test_the_generation_is_read_from_its_attribute_whatever_comes_before_it() -> None:
    gen = attr(1, struct.pack(">I", 0xDEADBEEF))
    assert generation_in(answer(gen)) == 0xDEADBEEF
    assert generation_in(answer(attr(2, struct.pack("=I", 77)) + attr(3, b"iptables\0") + gen)) == 0xDEADBEEF


def test_anything_but_our_answer_is_no_generation() -> None:
    gen = attr(1, struct.pack(">I", 5))
    assert generation_in(answer(gen, msg_type=NLMSG_ERROR)) is None
    assert generation_in(answer(gen, seq=2)) is None  # not the answer to our request
    assert generation_in(answer(attr(2, struct.pack("=I", 5)))) is None  # no NFTA_GEN_ID
    assert generation_in(answer(attr(1, b"\0\0\0\0\0\0\0\0"))) is None  # a wrong-sized one
    assert generation_in(answer(gen)[:-2]) is None  # cut short
    assert generation_in(answer(gen, length=4096)) is None  # says it is longer than it is
    assert generation_in(answer(struct.pack("=HH", 2, 1) + gen)) is None  # an attribute shorter than its header
    assert generation_in(b"") is None


@given(st.binary(max_size=96))
def test_no_bytes_make_it_raise(data: bytes) -> None:
    got = generation_in(data)
    assert got is None or 0 <= got < 2**32


@given(st.binary(max_size=48))
def test_no_attributes_make_it_raise(attrs: bytes) -> None:
    got = generation_in(answer(attrs))
    assert got is None or 0 <= got < 2**32
