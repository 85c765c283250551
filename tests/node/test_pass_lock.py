"""One reaper at a time per node, with real processes on one private state dir: a second
reaper waits while another's pass holds the lock beside the state file, then gives up with exit
4 and a line naming the holder; the agent holds the lock for a pass, not between passes, so an
operator's one-shot runs between two of them.

The runtime is a fake CRI in this process whose ListPodSandbox is held at a gate: a reaper that
reached it is inside its pass (the lock is taken before the pass looks at anything), and no
second reaper may reach it until the gate opens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests.harness.fake_cri import FakeRuntime, sandbox_list
from tests.harness.probe import run_probe
from tests.harness.probes import lock_on_full_disk, lock_read_only

WAIT_FOR = 60.0  # seconds the test waits for a process to get somewhere before failing
WAITING = "waiting for another reaper's pass"


class GatedRuntime(FakeRuntime):
    """A runtime that lists nothing, holding every ListPodSandbox until `gate` is set; `arrived`
    is set by the first that comes."""

    def __init__(self, path: Path) -> None:
        self.gate = threading.Event()
        self.arrived = threading.Event()
        super().__init__(path, sandbox_list([]), {})

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        listed = super()._list(request, context)
        self.arrived.set()
        self.gate.wait(WAIT_FOR * 2)
        return listed


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[GatedRuntime]:
    with GatedRuntime(tmp_path / "cri.sock") as cri:
        try:
            yield cri
        finally:
            cri.gate.set()  # no reaper left waiting at the gate


def reaper_argv(tmp: Path, command: str, *extra: str) -> list[str]:
    """`reaper COMMAND` in a netns of its own (loopback up, for the agent's listener), on the
    test's dirs and state file; the process's pid is the reaper's (unshare and sh exec it)."""
    for sub in ("net.d", "networks", "cni", "netns", "bin"):
        (tmp / sub).mkdir(exist_ok=True)
    d = str(tmp)
    return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
            sys.executable, "-m", "reaper", command,
            "--cni-conf-dir", f"{d}/net.d", "--ipam-dir", f"{d}/networks", "--cni-cache-dir", f"{d}/cni",
            "--netns-dir", f"{d}/netns", "--cni-bin-dir", f"{d}/bin", "--runtime-endpoint", f"unix://{d}/cri.sock",
            "--state-file", f"{d}/state/state.json", *extra]  # fmt: skip


def start(argv: list[str], log: Path, lock_wait: str) -> subprocess.Popen[bytes]:
    """The reaper, its stdout and stderr into `log`; REAPER_LOCK_WAIT set (a variable, not the
    flag: a reaper without the lock runs all the same, which is what the test must catch)."""
    env = {**os.environ, "REAPER_LOCK_WAIT": lock_wait}
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def until(done: Callable[[], bool], what: str) -> None:
    """Poll `done()` until true, at most WAIT_FOR seconds."""
    deadline = time.monotonic() + WAIT_FOR
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_second_reaper_waits_then_exits_naming_the_first(tmp_path: Path, runtime: GatedRuntime) -> None:
    first = start(reaper_argv(tmp_path, "reap"), tmp_path / "first.log", "60s")
    second: subprocess.Popen[bytes] | None = None
    try:
        assert runtime.arrived.wait(WAIT_FOR), (tmp_path / "first.log").read_text()
        second = start(reaper_argv(tmp_path, "reap", "--json"), tmp_path / "second.log", "1s")
        # Without the lock the second reaper runs its pass beside the first and reaches the
        # runtime too; with it, it gives up first.
        until(lambda: second.poll() is not None or runtime.calls["ListPodSandbox"] > 1, "the second ends")
        second_log = (tmp_path / "second.log").read_text()
        assert runtime.calls["ListPodSandbox"] == 1, f"two passes at once:\n{second_log}"
        assert second.wait(WAIT_FOR) == 4, second_log
        lock = tmp_path / "state" / "state.json.lock"
        (line,) = [x for x in second_log.splitlines() if x.startswith("reaper: ")]
        assert line.startswith(f"reaper: another reaper holds {lock} (pid {first.pid}: reaper reap "), line
        assert line.endswith("waited 1s, nothing done"), line
        assert "Traceback" not in second_log
    finally:
        runtime.gate.set()
        assert first.wait(WAIT_FOR) == 0, (tmp_path / "first.log").read_text()
        if second is not None:
            stop(second)
    # The first's lock went with it: the next reaper does not wait at all.
    third = subprocess.run(
        reaper_argv(tmp_path, "reap", "--lock-wait", "0"), capture_output=True, text=True, timeout=WAIT_FOR
    )
    assert third.returncode == 0, third.stderr
    assert stat_mode(tmp_path / "state" / "state.json.lock") == 0o600


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_the_agent_and_a_one_shot_take_turns(tmp_path: Path, runtime: GatedRuntime) -> None:
    # An hour between passes: after its first pass the agent stays idle for the rest of the test.
    agent_argv = reaper_argv(tmp_path, "run", "--mode", "scan", "--interval", "1h", "--listen", "127.0.0.1:9753")
    agent = start(agent_argv, tmp_path / "agent.log", "60s")
    one_shot: subprocess.Popen[bytes] | None = None
    try:
        assert runtime.arrived.wait(WAIT_FOR), (tmp_path / "agent.log").read_text()
        # The agent's first pass is at the gate, holding the lock: the operator's scan waits.
        one_shot = start(reaper_argv(tmp_path, "scan"), tmp_path / "one-shot.log", "60s")
        until(
            lambda: (
                WAITING in (tmp_path / "one-shot.log").read_text()
                or runtime.calls["ListPodSandbox"] > 1
                or one_shot.poll() is not None
            ),
            "the one-shot waits or runs",
        )
        waiting = (tmp_path / "one-shot.log").read_text()
        assert runtime.calls["ListPodSandbox"] == 1, f"the one-shot ran inside the agent's pass:\n{waiting}"
        assert WAITING in waiting and f"pid {agent.pid}: reaper run " in waiting, waiting
        # The agent's pass ends and lets the lock go; the one-shot's pass runs.
        runtime.gate.set()
        assert one_shot.wait(WAIT_FOR) == 0, (tmp_path / "one-shot.log").read_text()
        assert runtime.calls["ListPodSandbox"] == 2
        # Between passes the agent holds nothing: a one-shot that will not wait runs at once.
        idle = subprocess.run(
            reaper_argv(tmp_path, "scan", "--lock-wait", "0"), capture_output=True, text=True, timeout=WAIT_FOR
        )
        assert idle.returncode == 0, idle.stderr
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()
    finally:
        runtime.gate.set()
        if one_shot is not None:
            stop(one_shot)
        stop(agent)
    assert agent.returncode == 0
    agent_log = (tmp_path / "agent.log").read_text()
    assert "pass" in agent_log and "outcome=ok" in agent_log, agent_log


def test_a_full_disk_does_not_stop_the_lock(tmp_path: Path) -> None:
    """No room for the holder's record: the lock is held all the same, and a waiter is told so."""
    (tmp_path / "full").mkdir()
    out = run_probe(lock_on_full_disk, str(tmp_path / "full"))
    assert out["size"] == 0
    assert "(a holder that left no record)" in out["busy"]


def test_where_the_state_dir_is_read_only_only_a_scan_goes_on_without_the_lock(tmp_path: Path) -> None:
    """A scan that can save no state (a read-only state dir, a user other than root) changes
    nothing the lock guards and goes on with a warning; a reap does not start."""
    (tmp_path / "ro").mkdir()
    out = run_probe(lock_read_only, str(tmp_path / "ro"))
    assert out["scan_held"] is False
    (warning,) = out["scan_warned"]
    assert "Read-only file system" in warning and "going on without it" in warning, warning
    assert out["reap"] == f"cannot take the lock {tmp_path}/ro/state.json.lock: Read-only file system", out
