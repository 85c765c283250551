"""What the forked CRI client's parent reads from its child: a view, or an error it turns into a
view that decides nothing. Whatever comes back on the socket is never an exception of any other
kind, and a length that promises more than 256 MiB is never waited for or allocated."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.model import NsKey, RuntimeAnswer, RuntimeView, Sandbox
from reaper.runtime.forked import MAX_MESSAGE, Request, WorkerGone, read_view, send_request
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
ASKED = Request(("unix:///run/containerd/containerd.sock",), 2.0, {})


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


def ask(sock: socket.socket, request: Request) -> RuntimeView:
    send_request(sock, request)
    return read_view(sock)


def framed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_a_view_comes_back_whole_and_the_request_carries_the_runtimes_and_the_known_paths(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    theirs.sendall(framed(msgspec.msgpack.encode(VIEW)))
    assert ask(ours, Request(("unix:///a.sock", "unix:///b.sock"), 2.5, {"a@1": "/var/run/netns/cni-1"})) == VIEW
    (size,) = struct.unpack(">I", theirs.recv(4))
    assert msgspec.msgpack.decode(theirs.recv(size)) == {
        "endpoints": ["unix:///a.sock", "unix:///b.sock"],
        "timeout": 2.5,
        "known_netns": {"a@1": "/var/run/netns/cni-1"},
    }


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
        ask(ours, ASKED)


@FUZZ
@given(st.binary(max_size=300))
def test_any_answer_is_a_view_or_one_of_three_errors(answer: bytes) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        theirs.sendall(framed(answer))
        theirs.shutdown(socket.SHUT_WR)
        with contextlib.suppress(*FAILURES):
            assert isinstance(ask(ours, ASKED), RuntimeView)
    finally:
        ours.close()
        theirs.close()


# In a fresh interpreter (the parent of a fork must not have imported grpc): eight threads ask
# at once, as a reap's DEL workers re-check the runtimes, each of them several times.
AT_ONCE = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from reaper.runtime.forked import ForkedLiveness
with ForkedLiveness((sys.argv[1],), 2.0) as liveness:
    with ThreadPoolExecutor(max_workers=8) as pool:
        views = list(pool.map(lambda _: liveness.observe({}), range(40)))
print(json.dumps(sorted({str(v.error) for v in views})))
"""


def test_threads_asking_at_once_each_get_the_childs_answer(tmp_path: Path) -> None:
    endpoint = f"unix://{tmp_path / 'nobody.sock'}"
    proc = subprocess.run(
        [sys.executable, "-c", AT_ONCE, endpoint], capture_output=True, text=True, timeout=120, check=True
    )
    (error,) = json.loads(proc.stdout)  # one answer, forty times: the runtime's, never a torn message
    assert "nobody.sock" in error and "gave no answer" not in error


NO_FORK = """
import errno, json, os, sys
def refused():
    raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
os.fork = refused  # a node out of processes
from reaper.runtime.forked import ForkedLiveness
with ForkedLiveness((sys.argv[1],), 2.0) as liveness:
    view = liveness.observe({})
print(json.dumps({"pid": liveness.pid, "error": view.error, "grpc_here": "grpc" in sys.modules}))
"""


def test_a_node_that_forks_no_process_is_asked_from_this_one(tmp_path: Path) -> None:
    endpoint = f"unix://{tmp_path / 'nobody.sock'}"
    proc = subprocess.run(
        [sys.executable, "-c", NO_FORK, endpoint], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(proc.stdout)
    assert out["pid"] is None and out["grpc_here"]  # the client ran here
    assert "nobody.sock" in out["error"] and "gave no answer" not in out["error"]


ASKED_AHEAD = """
import json, socket, sys
from reaper.runtime.forked import ForkedLiveness
runtime = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
runtime.bind(sys.argv[1])
runtime.listen(8)
runtime.settimeout(20)
with ForkedLiveness((f"unix://{sys.argv[1]}",), 5.0) as liveness:
    answer = liveness.ask({})
    conn, _ = runtime.accept()  # the child is asking the runtime: nobody has read its answer yet
    conn.close()
    view = answer()
print(json.dumps({"reachable": view.reachable, "error": view.error}))
"""


def test_asking_ahead_starts_the_childs_request_before_its_answer_is_read(tmp_path: Path) -> None:
    socket_path = tmp_path / "runtime.sock"
    proc = subprocess.run(
        [sys.executable, "-c", ASKED_AHEAD, str(socket_path)], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(proc.stdout)
    assert not out["reachable"] and "runtime.sock" in out["error"] and "gave no answer" not in out["error"]


AIMED_LATER = """
import json, sys
from reaper.runtime.forked import ForkedLiveness
with ForkedLiveness() as liveness:  # forked before the settings are read
    liveness.aim((sys.argv[1],), 2.0)
    first = liveness.observe({})
    liveness.aim((sys.argv[2],), 2.0)
    second = liveness.observe({})
print(json.dumps({"pid": liveness.pid, "errors": [first.error, second.error], "grpc_here": "grpc" in sys.modules}))
"""


def test_a_child_forked_before_the_settings_asks_the_runtimes_aimed_at_since(tmp_path: Path) -> None:
    first, second = f"unix://{tmp_path / 'first.sock'}", f"unix://{tmp_path / 'second.sock'}"
    proc = subprocess.run(
        [sys.executable, "-c", AIMED_LATER, first, second], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(proc.stdout)
    assert out["pid"] is None and not out["grpc_here"]  # closed; the client ran in the child
    one, two = out["errors"]
    assert "first.sock" in one and "second.sock" not in one and "gave no answer" not in one
    assert "second.sock" in two and "first.sock" not in two


STOPPED = """
import json, os, signal, sys, time
from reaper.runtime.forked import ForkedLiveness
with ForkedLiveness((sys.argv[1],), 0.2, margin=0.5) as liveness:
    child = liveness.pid
    os.kill(child, signal.SIGSTOP)  # a child that never answers
    started = time.monotonic()
    first = liveness.observe({})
    waited = time.monotonic() - started
    again = liveness.observe({})
    left = os.path.exists(f"/proc/{child}")
print(json.dumps({"errors": [first.error, again.error], "reachable": [first.reachable, again.reachable],
                  "waited": waited, "child": child, "child_left": left}))
"""


def test_a_one_shots_wait_for_the_runtimes_has_a_deadline(tmp_path: Path) -> None:
    """A child that does not answer by its deadline (its calls' deadlines and a margin) is
    killed and reaped; that request and every later one get a view that decides nothing."""
    endpoint = f"unix://{tmp_path / 'nobody.sock'}"
    proc = subprocess.run(
        [sys.executable, "-c", STOPPED, endpoint], capture_output=True, text=True, timeout=60, check=True
    )
    out = json.loads(proc.stdout)
    assert out["reachable"] == [False, False]
    assert f"pid {out['child']}" in out["errors"][0] and "deadline" in out["errors"][0]
    assert "gave no answer" in out["errors"][1]
    assert out["waited"] < 10 and not out["child_left"]
