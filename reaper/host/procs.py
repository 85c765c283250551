"""Which processes (and threads) are inside which namespace, and who they are."""

from __future__ import annotations

import errno
import os
from collections.abc import Collection, Iterable, Iterator, Mapping

import psutil
from msgspec import Struct

from reaper.model import Holder, NsKey

MAX_ANCESTRY = 64  # parents walked to tell whether the reaper started a process
COMM_MAX = 15  # the kernel's TASK_COMM_LEN less its NUL: a longer name is cut in /proc
CMDLINE_BYTES = 4096  # of a command line read for its first argument
PROC_PID_INIT_INO = 0xEFFFFFFC  # the kernel's fixed inode number of the initial PID namespace


def netns_members(proc: str = "/proc") -> dict[NsKey, set[int]]:
    return namespace_members("net", proc)


def listed_pids(proc: str) -> list[str]:
    """The pids `proc` lists; OSError when it cannot be listed, lists none, or not this one (then
    it is no process table of this node)."""
    pids = [entry for entry in os.listdir(proc) if entry.isdigit()]
    if not pids:
        raise OSError(errno.EIO, f"{proc} lists no process")
    if str(os.getpid()) not in pids:
        raise OSError(errno.EIO, f"{proc} does not list this process (pid {os.getpid()})")
    return pids


def namespace_members(ns_type: str, proc: str = "/proc") -> dict[NsKey, set[int]]:
    """Map every namespace of `ns_type` (a name under /proc/<pid>/ns) some task is in to its
    tasks' pids; every thread counts, as one can setns() alone. OSError when the walk cannot be
    whole (listed_pids): an empty answer would let every namespace go."""
    members: dict[NsKey, set[int]] = {}
    for entry in listed_pids(proc):
        for base, _ in tasks(proc, entry):
            try:
                st = os.stat(f"{base}/ns/{ns_type}")
            except OSError:
                continue
            members.setdefault(NsKey(st.st_dev, st.st_ino), set()).add(int(entry))
    return members


def tasks(proc: str, pid: str) -> Iterator[tuple[str, int]]:
    """(/proc dir, id) of the process, then of each of its other threads (a thread's id reaches
    it as a pid does); just the process when it has exited."""
    base = f"{proc}/{pid}"
    yield base, int(pid)
    try:
        # The task dir's link count is 2 + its threads: listed only when there are several.
        tids = os.listdir(f"{base}/task") if os.stat(f"{base}/task").st_nlink > 3 else []
    except OSError:
        return
    for tid in tids:
        if tid != pid and tid.isdigit():
            yield f"{base}/task/{tid}", int(tid)


class ProcessFacts(Struct, frozen=True):
    """A process's name, parent, start time (epoch seconds) and executable ("": unreadable)."""

    comm: str
    ppid: int
    started_at: float
    exe: str


def process_facts(pid: int) -> ProcessFacts | None:
    """The facts of `pid` (psutil's), or None when it is gone or cannot be read."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            comm, ppid, started_at = proc.name(), proc.ppid(), proc.create_time()
            try:
                exe = proc.exe()
            except psutil.AccessDenied:
                exe = ""  # a kernel thread, or another user's process without the rights to see it
    except psutil.Error:
        return None
    return ProcessFacts(comm=comm, ppid=ppid, started_at=started_at, exe=exe)


def describe(pids: Iterable[int], bin_dirs: tuple[str, ...]) -> dict[int, Holder]:
    """Holders for `pids`: CNI plugins (executables in a bin dir) told from the rest, and this
    reaper's own (by start times, never a reusable pid) from everyone else's."""
    real_dirs = tuple(os.path.realpath(d) for d in bin_dirs)
    holders = {}
    mine = process_facts(os.getpid())
    if mine is None:
        return {pid: Holder(pid=pid, comm="", is_cni_plugin=False) for pid in pids}
    me = (os.getpid(), mine.started_at)
    for pid in sorted(set(pids)):
        resident = _resident(pid, real_dirs)
        if resident is not None:
            holders[pid] = resident
            continue
        facts = process_facts(pid)
        if facts is None:
            holders[pid] = Holder(pid=pid, comm="", is_cni_plugin=False)  # gone: it held nothing for long
            continue
        plugin = bool(facts.exe) and os.path.dirname(facts.exe) in real_dirs
        ours = plugin and _started_by(facts, me)
        holders[pid] = Holder(
            pid=pid, comm=facts.comm, is_cni_plugin=plugin, reapers_own=ours, started_at=facts.started_at
        )
    return holders


def _resident(pid: int, real_dirs: tuple[str, ...]) -> Holder | None:
    """The process as no CNI plugin when its executable's path says so, named as psutil names it,
    in two or three reads (a look describes every pod's processes); None: ask process_facts."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")  # what psutil's exe() reads
        with open(f"/proc/{pid}/comm", "rb") as file:
            comm = os.fsdecode(file.read().removesuffix(b"\n"))
        if not exe or os.path.dirname(exe) in real_dirs:
            return None
        name = _whole_name(pid, comm) if len(comm) >= COMM_MAX else comm
    except OSError:
        return None
    return None if name is None else Holder(pid=pid, comm=name, is_cni_plugin=False)


def _whole_name(pid: int, cut: str) -> str | None:
    """A name /proc cut at 15 characters, made whole as psutil's name() does (from the first
    argument); None where psutil may read it otherwise (empty, or a space it splits at)."""
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        data = file.read(CMDLINE_BYTES)
    first, nul, _ = data.partition(b"\0")
    if not nul or not first or b" " in first:
        return None
    whole = os.path.basename(os.fsdecode(first))
    return whole if whole.startswith(cut) else cut


def _started_by(facts: ProcessFacts, ancestor: tuple[int, float]) -> bool:
    """Whether `ancestor` (pid, start time) started the process of `facts`, directly or not; a
    parent younger than its child is a reused pid, not an ancestor."""
    child_started = facts.started_at
    for _ in range(MAX_ANCESTRY):
        parent_pid = facts.ppid
        if parent_pid <= 0:
            return False
        parent = process_facts(parent_pid)
        if parent is None or parent.started_at > child_started:
            return False
        if parent_pid == ancestor[0]:
            return parent.started_at == ancestor[1]
        child_started, facts = parent.started_at, parent
    return False


def holders_by_netns(
    bin_dirs: tuple[str, ...], only: Collection[NsKey] | None = None
) -> dict[NsKey, tuple[Holder, ...]]:
    """The processes in each namespace some process is in, described (with `only`, just those
    namespaces'; the others' as plain holders that keep them busy)."""
    members = netns_members()
    wanted = set(members if only is None else only)
    described = describe({pid for ns, pids in members.items() if ns in wanted for pid in pids}, bin_dirs)
    described.update(
        (pid, Holder(pid=pid, comm="", is_cni_plugin=False))
        for ns, pids in members.items()
        if ns not in wanted
        for pid in pids
        if pid not in described
    )
    return {ns: tuple(described[pid] for pid in sorted(pids)) for ns, pids in members.items()}


class EveryNamespaceBusy(Mapping[NsKey, str]):
    """The answer of a failed walk of /proc: a mapping whose every lookup gives `reason`, so
    that any namespace asked about is left."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __getitem__(self, key: NsKey) -> str:
        return self.reason

    def __contains__(self, key: object) -> bool:
        return True

    def __iter__(self) -> Iterator[NsKey]:
        return iter(())

    def __len__(self) -> int:
        return 0


def busy_namespaces(bin_dirs: tuple[str, ...], only: Collection[NsKey] | None = None) -> Mapping[NsKey, str]:
    """Namespaces some process (not a plugin of this reaper's) is in now, with why; `only` as in
    holders_by_netns. EveryNamespaceBusy when /proc cannot be walked whole."""
    try:
        by_netns = holders_by_netns(bin_dirs, only)
    except OSError as err:
        return EveryNamespaceBusy(f"who is in its netns cannot be seen now (the walk of /proc failed: {err})")
    inside = {ns: [h for h in holders if h.keeps_netns_busy] for ns, holders in by_netns.items()}
    return {ns: f"its netns is in use now (pid {ps[0].pid}, {ps[0].comm})" for ns, ps in inside.items() if ps}


def unseen_processes(proc: str = "/proc") -> str | None:
    """Why this process cannot see every process on the node (it needs the host's PID namespace
    and its /proc, or a held netns looks unheld), or None."""
    try:
        if os.readlink(f"{proc}/self") != str(os.getpid()):
            return f"{proc} belongs to another PID namespace: the processes that hold a netns cannot be seen"
        ino = os.stat(f"{proc}/self/ns/pid").st_ino
    except OSError as err:
        return f"{proc} cannot be read ({err.strerror}): the processes that hold a netns cannot be seen"
    if ino != PROC_PID_INIT_INO:
        return "not in the host's PID namespace (run with hostPID): the processes that hold a netns cannot be seen"
    return None
