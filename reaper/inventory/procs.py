"""Which processes (and threads) are inside which network namespace, from /proc."""

from __future__ import annotations

import os
from collections.abc import Iterable

from reaper.model import Holder, NsKey


def netns_members(proc: str = "/proc") -> dict[NsKey, set[int]]:
    """Map every network namespace some task is in to the pids of those tasks' processes."""
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
        # A thread can setns() on its own, so every task counts.
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


def describe(pids: Iterable[int], bin_dirs: tuple[str, ...], proc: str = "/proc") -> dict[int, Holder]:
    """Holders for `pids`, telling apart CNI plugins (executables in a bin dir) from the rest."""
    real_dirs = tuple(os.path.realpath(d) for d in bin_dirs)
    holders = {}
    for pid in sorted(set(pids)):
        comm = ""
        try:
            with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
                comm = f.read().strip()
        except OSError:
            pass
        try:
            exe = os.readlink(f"{proc}/{pid}/exe")
        except OSError:
            exe = ""
        plugin = bool(exe) and os.path.dirname(exe) in real_dirs
        ours = plugin and _descends_from(pid, os.getpid(), proc)
        holders[pid] = Holder(pid=pid, comm=comm, is_cni_plugin=plugin, reapers_own=ours)
    return holders


def _descends_from(pid: int, ancestor: int, proc: str) -> bool:
    """Whether `ancestor` started `pid` (directly or through its children)."""
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"{proc}/{pid}/stat", encoding="utf-8", errors="replace") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False
