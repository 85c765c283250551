"""A call answered by a forked child: its answer, or an OSError saying what went wrong; never a
child left behind, never another exception."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from reaper.host import forkcall
from reaper.host.forkcall import ForkedCall
from reaper.host.netlink import RawLink, dump_links


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_childs_answer_is_the_calls_and_the_child_is_reaped() -> None:
    call = ForkedCall(dump_links, list[RawLink])
    pid = call.pid
    assert pid is not None and pid != os.getpid()
    assert call.result() == dump_links()  # this netns's links, decoded in the child
    assert call.pid is None and _gone(pid)
    call.close()  # a second close signals no one


def test_a_call_that_raises_is_an_oserror_with_its_words() -> None:
    def refused() -> list[RawLink]:
        raise PermissionError(1, "Operation not permitted")

    with pytest.raises(OSError, match=r"^\[Errno 1\] Operation not permitted$"):
        ForkedCall(refused, list[RawLink]).result()


def test_an_answer_of_another_type_is_no_answer() -> None:
    def other() -> list[RawLink]:
        return [{"ifindex": "one"}]  # type: ignore[list-item]

    with pytest.raises(OSError, match="gave no answer"):
        ForkedCall(other, list[RawLink]).result()


def test_a_child_killed_before_it_answers_is_an_oserror_naming_it() -> None:
    def slow() -> int:
        time.sleep(60)
        return 1

    call = ForkedCall(slow, int)
    pid = call.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(OSError, match=f"pid {pid}.*hung up"):
        call.result()
    assert _gone(pid)


def test_a_child_that_never_answers_is_given_up_on_and_killed() -> None:
    def hung() -> int:
        time.sleep(60)
        return 1

    call = ForkedCall(hung, int, timeout=0.5)
    pid = call.pid
    assert pid is not None
    with pytest.raises(OSError):
        call.result()
    assert _gone(pid)


@pytest.mark.parametrize(
    "wire",
    [
        forkcall._LENGTH.pack(0),
        forkcall._LENGTH.pack(5) + b"\x02junk",
        forkcall._LENGTH.pack(2) + b"\x00\xc1",
        forkcall._LENGTH.pack(100) + b"\x00cut short",
        forkcall._LENGTH.pack(forkcall.MAX_MESSAGE + 1),
    ],
    ids=["empty", "neither-flag", "not-msgpack", "cut-short", "oversized-length"],
)
def test_torn_or_hostile_answers_are_oserrors(monkeypatch: pytest.MonkeyPatch, wire: bytes) -> None:
    # The child writes these bytes in place of its answer, and exits.
    def answer(sock: socket.socket, call: object) -> None:
        sock.sendall(wire)
        os._exit(0)

    monkeypatch.setattr(forkcall, "_answer", answer)
    call = ForkedCall(dump_links, list[RawLink], timeout=10.0)
    pid = call.pid
    with pytest.raises(OSError):
        call.result()
    assert pid is not None and _gone(pid)


def test_a_call_told_not_to_fork_is_answered_in_this_process() -> None:
    call = ForkedCall(os.getpid, int, fork=False)
    assert call.pid is None
    assert call.result() == os.getpid()


def test_a_node_that_forks_nothing_is_answered_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    call = ForkedCall(os.getpid, int)
    assert call.pid is None
    assert call.result() == os.getpid()


def test_the_child_holds_neither_stdin_nor_stdout() -> None:
    """`reaper scan | jq` ends with the parent, though a forked call still runs."""
    code = (
        "import os, time\n"
        "from reaper.host.forkcall import ForkedCall\n"
        "call = ForkedCall(lambda: time.sleep(30), type(None))\n"
        "print(call.pid, flush=True)\n"
        "os._exit(0)\n"  # no close: the child lives on
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=20
    )
    child = int(proc.stdout.split()[0])
    try:
        assert time.monotonic() - started < 20  # the pipe closed with the parent, not the child
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_child_whose_parent_was_killed_ends_at_its_send() -> None:
    """The parent killed outright (no close): the child finishes its call, finds no one to
    answer (EPIPE: its answer is bigger than the socket's buffer) and exits."""
    code = (
        "import os, signal, time\n"
        "from reaper.host.forkcall import ForkedCall\n"
        "call = ForkedCall(lambda: (time.sleep(1), 'x' * (8 << 20))[1], str)\n"
        "print(call.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=20
    )
    assert proc.returncode == -signal.SIGKILL
    child = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 15
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert not os.path.exists(f"/proc/{child}")
    finally:
        if os.path.exists(f"/proc/{child}"):
            os.kill(child, signal.SIGKILL)
