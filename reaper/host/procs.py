"""Which processes (and threads) are inside which network namespace, and who they are."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import psutil

from reaper.model import Holder, NsKey

MAX_ANCESTRY = 64  # parents walked to tell whether the reaper started a process
PROC_PID_INIT_INO = 0xEFFFFFFC  # the kernel's fixed inode number of the initial PID namespace


def netns_members(proc: str = "/proc") -> dict[NsKey, set[int]]:
    """Map every network namespace some task is in to the pids of those tasks' processes.

    Read from /proc directly: psutil does not expose namespaces, and a thread can setns() on
    its own, so every task of a many-threaded process counts.
    """
    members: dict[NsKey, set[int]] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        base = f"{proc}/{entry}"
        seen: set[tuple[int, int]] = set()
        try:
            st = os.stat(f"{base}/ns/net")
            seen.add((st.st_dev, st.st_ino))
        except OSError:
            pass
        try:
            tasks = os.listdir(f"{base}/task")
        except OSError:
            tasks = []
        if len(tasks) > 1:
            for tid in tasks:
                try:
                    st = os.stat(f"{base}/task/{tid}/ns/net")
                except OSError:
                    continue
                seen.add((st.st_dev, st.st_ino))
        for dev, ino in seen:
            members.setdefault(NsKey(dev, ino), set()).add(pid)
    return members


def describe(pids: Iterable[int], bin_dirs: tuple[str, ...]) -> dict[int, Holder]:
    """Holders for `pids`, telling apart CNI plugins (executables in a bin dir) from the rest,
    and the plugins this reaper started from everyone else's.

    psutil gives each process its start time, which makes "started by this reaper" a claim
    about a process, not about a pid number that may have been reused.
    """
    real_dirs = tuple(os.path.realpath(d) for d in bin_dirs)
    me = psutil.Process()
    holders = {}
    for pid in sorted(set(pids)):
        try:
            process = psutil.Process(pid)
            started_at = process.create_time()
        except psutil.Error:
            holders[pid] = Holder(pid=pid, comm="", is_cni_plugin=False)  # gone: it held nothing for long
            continue
        comm = _quietly(process.name)
        exe = _quietly(process.exe)
        plugin = bool(exe) and os.path.dirname(exe) in real_dirs
        ours = plugin and _started_by(process, me)
        holders[pid] = Holder(pid=pid, comm=comm, is_cni_plugin=plugin, reapers_own=ours, started_at=started_at)
    return holders


def _quietly(read: Callable[[], str]) -> str:
    try:
        return read()
    except psutil.Error:
        return ""


def _started_by(process: psutil.Process, ancestor: psutil.Process) -> bool:
    """Whether `ancestor` started `process` (directly or through its children). A parent is
    never younger than its child: a younger one is a reused pid, not an ancestor."""
    try:
        child_started = process.create_time()
        for _ in range(MAX_ANCESTRY):
            parent = process.parent()
            if parent is None:
                return False
            parent_started = parent.create_time()
            if parent_started > child_started:
                return False
            if parent.pid == ancestor.pid:
                return parent_started == ancestor.create_time()
            process, child_started = parent, parent_started
    except psutil.Error:
        return False
    return False


def holders_by_netns(bin_dirs: tuple[str, ...], only: NsKey | None = None) -> dict[NsKey, tuple[Holder, ...]]:
    """The processes in each namespace some process is in (with `only`, just that one)."""
    members = netns_members()
    if only is not None:
        members = {only: members[only]} if only in members else {}
    described = describe({pid for pids in members.values() for pid in pids}, bin_dirs)
    return {ns: tuple(described[pid] for pid in sorted(pids)) for ns, pids in members.items()}


def busy_namespaces(bin_dirs: tuple[str, ...], only: NsKey | None = None) -> dict[NsKey, str]:
    """Namespaces some process is in right now (not a plugin of this reaper's), with why."""
    busy = {}
    for ns, holders in holders_by_netns(bin_dirs, only).items():
        inside = [h for h in holders if h.keeps_netns_busy]
        if inside:
            busy[ns] = f"its netns is in use now (pid {inside[0].pid}, {inside[0].comm})"
    return busy


def unseen_processes(proc: str = "/proc") -> str | None:
    """Why this process cannot see every process on the node, or None when it can: it must be
    in the host's PID namespace, with a /proc of that namespace. Without that, a netns that
    some process holds looks unheld."""
    try:
        if os.readlink(f"{proc}/self") != str(os.getpid()):
            return f"{proc} belongs to another PID namespace: the processes that hold a netns cannot be seen"
        ino = os.stat(f"{proc}/self/ns/pid").st_ino
    except OSError as err:
        return f"{proc} cannot be read ({err.strerror}): the processes that hold a netns cannot be seen"
    if ino != PROC_PID_INIT_INO:
        return "not in the host's PID namespace (run with hostPID): the processes that hold a netns cannot be seen"
    return None
