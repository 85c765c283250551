"""Whether every process on the node can be seen, judged from /proc."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reaper.host import procs
from reaper.host.procs import describe, netns_members, unseen_processes
from reaper.model import Attachment, AttachmentKey, Holder, NsKey
from reaper.reap.plan import listed, recheck_reason
from tests.harness.snapshots import cid, runtime


def test_a_proc_of_another_pid_namespace_is_told_apart(tmp_path: Path) -> None:
    (tmp_path / "self").symlink_to(str(os.getpid() + 100_000))  # /proc/self names another pid
    assert "another PID namespace" in str(unseen_processes(str(tmp_path)))
    assert "cannot be read" in str(unseen_processes(str(tmp_path / "missing")))


def test_a_proc_of_a_pid_namespace_other_than_the_hosts(tmp_path: Path) -> None:
    (tmp_path / str(os.getpid()) / "ns").mkdir(parents=True)
    (tmp_path / str(os.getpid()) / "ns" / "pid").touch()  # not the initial PID namespace's inode
    (tmp_path / "self").symlink_to(str(os.getpid()))
    assert "host's PID namespace" in str(unseen_processes(str(tmp_path)))


def test_a_plugin_this_process_started_is_its_own_and_one_it_did_not_start_is_not(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plugin = bin_dir / "long-plugin-name-over-fifteen"
    shutil.copy("/bin/sleep", plugin)
    started = time.time()
    ours = subprocess.Popen([str(plugin), "30"])
    # Started, then left by a shell that exits: its parent is no longer this process's child.
    theirs = int(
        subprocess.run(["sh", "-c", f"{plugin} 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True).stdout
    )
    other = subprocess.Popen(["sleep", "30"])
    try:
        held = describe([ours.pid, theirs, other.pid, 2**22 + 7], (str(bin_dir),))
    finally:
        for pid in (ours.pid, theirs, other.pid):
            os.kill(pid, signal.SIGKILL)
        ours.wait()
        other.wait()
    assert held[ours.pid].is_cni_plugin and held[ours.pid].reapers_own
    assert held[ours.pid].comm == plugin.name  # the whole name, not /proc's 15 characters
    assert abs(held[ours.pid].started_at - started) < 2
    assert held[theirs].is_cni_plugin and not held[theirs].reapers_own
    assert not held[other.pid].is_cni_plugin and held[other.pid].comm == "sleep"
    assert held[2**22 + 7] == Holder(pid=2**22 + 7, comm="", is_cni_plugin=False)  # no such process


def _proc_listing(tmp_path: Path, pids: list[int]) -> str:
    """A stand-in /proc that lists `pids` (each with no readable namespace) and a few non-pids."""
    for name in ("self", "sys", "meminfo", *(str(pid) for pid in pids)):
        (tmp_path / name).mkdir(exist_ok=True)
    return str(tmp_path)


@pytest.mark.parametrize(
    ("listed", "why"),
    [
        (None, "No such file"),  # cannot be listed at all
        ([], "lists no process"),
        ([1, 2, 3], "does not list this process"),
    ],
    ids=["unlistable", "no-pids", "not-this-process"],
)
def test_a_walk_of_proc_that_cannot_be_whole_raises_instead_of_finding_no_one(
    tmp_path: Path, listed: list[int] | None, why: str
) -> None:
    """An empty answer would read as "no process in any namespace"."""
    proc = str(tmp_path / "missing") if listed is None else _proc_listing(tmp_path, listed)
    with pytest.raises(OSError, match=why):
        netns_members(proc)
    assert netns_members(_proc_listing(tmp_path, [os.getpid()])) == {}  # listed, nothing readable: no one


def test_a_failed_walk_makes_every_namespace_busy_at_the_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-check just before acting asks who is in each namespace again: a walk of /proc that
    fails there leaves every attachment with a netns, whichever namespace it asks about."""
    real = procs.netns_members
    monkeypatch.setattr(procs, "netns_members", lambda: real("/nonexistent-proc"))
    busy = procs.busy_namespaces(())
    ns = NsKey(4, 4026532999)
    assert isinstance(busy, procs.EveryNamespaceBusy)
    assert ns in busy and "walk of /proc failed" in busy[ns] and busy.get(ns) == busy[ns]
    only = procs.busy_namespaces((), {ns})
    assert only.get(ns) is not None
    attachment = Attachment(
        key=AttachmentKey(cid(1), "mynet", "eth0"),
        resources=(),
        netns=ns,
        verdict="orphan",
        reason="no owner",
        age_seconds=700.0,
    )
    assert recheck_reason(attachment, listed(runtime()), busy) == busy[ns]
    monkeypatch.setattr(procs, "netns_members", real)
    assert not isinstance(procs.busy_namespaces(()), procs.EveryNamespaceBusy)


def test_members_of_any_namespace_type_are_walked_as_the_netns_ones_are() -> None:
    for ns_type in ("net", "ipc", "uts", "pid", "user"):
        st = os.stat(f"/proc/self/ns/{ns_type}")
        assert os.getpid() in procs.namespace_members(ns_type)[NsKey(st.st_dev, st.st_ino)]
    with pytest.raises(OSError):
        procs.namespace_members("ipc", "/nonexistent-proc")


@pytest.fixture
def asked_psutil(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids `describe` hands to psutil (procs.process_facts), in order."""
    asked: list[int] = []
    facts = procs.process_facts

    def counted(pid: int) -> procs.ProcessFacts | None:
        asked.append(pid)
        return facts(pid)

    monkeypatch.setattr(procs, "process_facts", counted)
    return asked


def _settled(pid: int, *, exe: Path | None = None, comm: str | None = None) -> None:
    """Wait until a child has exec'd `exe` or written its `comm`, as /proc shows it (10 s at most)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if exe is not None and os.readlink(f"/proc/{pid}/exe") == str(exe):
                return
            if comm is not None and Path(f"/proc/{pid}/comm").read_text() == comm + "\n":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not settle")


def test_a_resident_is_told_from_proc_without_psutil_and_named_as_psutil_names_it(
    tmp_path: Path, asked_psutil: list[int]
) -> None:
    """A look describes every process of every pod: a resident (no plugin) is told from /proc's
    exe link, comm and, for a name /proc cut, the command line's first argument. A command line
    psutil would split otherwise (a first argument with a space) is left to psutil."""
    long_name = tmp_path / "resident-with-a-long-name"
    shutil.copy("/bin/sleep", long_name)
    short = subprocess.Popen(["sleep", "30"])
    long = subprocess.Popen([str(long_name), "30"])
    rewritten = subprocess.Popen(["bash", "-c", f'exec -a "{long_name}: worker" {long_name} 30'])
    try:
        _settled(rewritten.pid, exe=long_name)
        held = describe([short.pid, long.pid, rewritten.pid], (str(tmp_path / "bin"),))
        by_psutil = procs.process_facts(rewritten.pid)
    finally:
        for proc in (short, long, rewritten):
            proc.kill()
            proc.wait()
    assert held[short.pid] == Holder(pid=short.pid, comm="sleep", is_cni_plugin=False)
    assert held[long.pid] == Holder(pid=long.pid, comm=long_name.name, is_cni_plugin=False)
    assert short.pid not in asked_psutil and long.pid not in asked_psutil
    assert by_psutil is not None and held[rewritten.pid].comm == by_psutil.comm and rewritten.pid in asked_psutil


def test_a_process_that_names_itself_a_plugin_is_no_plugin_and_a_huge_first_argument_is_psutils(
    tmp_path: Path, asked_psutil: list[int]
) -> None:
    """Any user sets its own comm and command line: a name is only words in a reason. A comm
    that calls itself a plugin (with a newline in it) does not make a plugin; a first argument
    longer than the bounded read goes to psutil, which names it as before."""
    renamed = subprocess.Popen(
        [sys.executable, "-c", "open('/proc/self/comm', 'w').write('bridge\\nloopback'); import time; time.sleep(30)"]
    )
    sleeper = tmp_path / "resident-with-a-long-name"
    shutil.copy("/bin/sleep", sleeper)
    huge = subprocess.Popen(["bash", "-c", f'exec -a "{"a" * 10_000}" {sleeper} 30'])
    try:
        _settled(renamed.pid, comm="bridge\nloopback")
        _settled(huge.pid, exe=sleeper)
        held = describe([renamed.pid, huge.pid], (str(tmp_path / "bin"),))
        by_psutil = procs.process_facts(huge.pid)
    finally:
        for proc in (renamed, huge):
            proc.kill()
            proc.wait()
    assert held[renamed.pid] == Holder(pid=renamed.pid, comm="bridge\nloopback", is_cni_plugin=False)
    assert by_psutil is not None and held[huge.pid].comm == by_psutil.comm == "resident-with-a"
    assert not held[huge.pid].is_cni_plugin and huge.pid in asked_psutil and renamed.pid not in asked_psutil
