"""What the forked CRI client's parent reads from its child: a view, or an error it turns into a
view that decides nothing. Whatever comes back on the socket is never an exception of any other
kind, and a length that promises more than 256 MiB is never waited for or allocated."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.model import NsKey, RuntimeAnswer, RuntimeView, Sandbox
from reaper.runtime.forked import MAX_MESSAGE, WorkerGone, ask
from tests.harness.fuzz import FUZZ

VIEW = RuntimeView(
    "unix:///run/containerd/containerd.sock",
    "containerd",
    "v2.1.4",
    True,
    None,
    (Sandbox("a" * 64, "web", "default", "uid-1", True, 1.5e9, "/var/run/netns/cni-1", NsKey(4, 4026532), "a@1"),),
    (RuntimeAnswer("unix:///run/containerd/containerd.sock", "--runtime-endpoint", "containerd", "v2", True, None, 1),),
)
FAILURES = (WorkerGone, OSError, msgspec.DecodeError)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


def framed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_a_view_comes_back_whole_and_the_request_carries_the_known_paths(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    theirs.sendall(framed(msgspec.msgpack.encode(VIEW)))
    assert ask(ours, {"a@1": "/var/run/netns/cni-1"}) == VIEW
    (size,) = struct.unpack(">I", theirs.recv(4))
    assert msgspec.msgpack.decode(theirs.recv(size)) == {"a@1": "/var/run/netns/cni-1"}


@pytest.mark.parametrize(
    "answer",
    [
        b"",  # hung up at once
        struct.pack(">I", 100) + b"x" * 10,  # cut short
        struct.pack(">I", MAX_MESSAGE + 1),  # more than any view: not waited for
        struct.pack(">I", 0xFFFFFFFF) + b"x",
        framed(b"\xc1"),  # no msgpack
        framed(msgspec.msgpack.encode({"endpoint": 1})),  # msgpack, no view
        framed(msgspec.msgpack.encode(["", None, None, "yes", None, []])),
    ],
)
def test_what_is_no_view_is_one_of_three_errors(pair: tuple[socket.socket, socket.socket], answer: bytes) -> None:
    ours, theirs = pair
    theirs.sendall(answer)
    theirs.shutdown(socket.SHUT_WR)
    with pytest.raises(FAILURES):
        ask(ours, {})


@FUZZ
@given(st.binary(max_size=300))
def test_any_answer_is_a_view_or_one_of_three_errors(answer: bytes) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        theirs.sendall(framed(answer))
        theirs.shutdown(socket.SHUT_WR)
        with contextlib.suppress(*FAILURES):
            assert isinstance(ask(ours, {}), RuntimeView)
    finally:
        ours.close()
        theirs.close()
