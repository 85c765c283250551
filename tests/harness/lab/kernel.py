"""Mounts, namespaces and processes, read from /proc and changed with plain syscalls.

mount(8) and umount(8) are not used on the host: libmount creates /run/mount (its utab) as a
side effect, and the lab must leave the machine exactly as it found it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MS_BIND = 0x1000
MS_SHARED = 1 << 20
MNT_DETACH = 0x2

NSFS_MAGIC = 0x6E736673
PROC_SUPER_MAGIC = 0x9FA0


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str, path: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", path)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2): source/fstype may be None (for propagation changes); data: fs options."""
    libc = _libc()
    rc = libc.mount(
        source.encode() if source is not None else None,
        target.encode(),
        fstype.encode() if fstype is not None else None,
        ctypes.c_ulong(flags),
        data.encode() if data is not None else None,
    )
    _check(int(rc), "mount", target)


def umount(target: str, flags: int = 0) -> None:
    rc = _libc().umount2(target.encode(), ctypes.c_int(flags))
    _check(int(rc), "umount2", target)


def make_shared_bind(path: Path) -> None:
    """Bind ``path`` on itself and make that mount shared (a peer group of its own)."""
    mount(str(path), str(path), None, MS_BIND)
    mount(None, str(path), None, MS_SHARED)


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/<pid>/mountinfo, with the fields the lab uses."""

    mount_id: int
    parent_id: int
    root: str
    mount_point: str
    optional: tuple[str, ...]
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo (octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mountinfo(pid: int | str = "self") -> list[MountEntry]:
    entries: list[MountEntry] = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        sep = fields.index("-")
        entries.append(
            MountEntry(
                mount_id=int(fields[0]),
                parent_id=int(fields[1]),
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                optional=tuple(fields[6:sep]),
                fstype=fields[sep + 1],
                source=_unescape(fields[sep + 2]),
            )
        )
    return entries


def _under(path: str, prefix: Path) -> bool:
    return path == str(prefix) or path.startswith(str(prefix).rstrip("/") + "/")


def mounts_under(prefix: Path, pid: int | str = "self") -> list[MountEntry]:
    """Mounts whose mount point or bind source root lies under ``prefix``."""
    return [m for m in mountinfo(pid) if _under(m.mount_point, prefix) or _under(m.root, prefix)]


def unmount_all_under(prefix: Path) -> list[str]:
    """Unmount every mount point under ``prefix`` in this mount namespace, deepest first.

    A mount that stays busy is detached (MNT_DETACH). Returns the mount points removed.
    """
    removed: list[str] = []
    for _ in range(8):
        points = sorted(
            {m.mount_point for m in mountinfo() if _under(m.mount_point, prefix)},
            key=lambda p: (-p.count("/"), p),
        )
        if not points:
            break
        for point in points:
            try:
                umount(point)
            except OSError as err:
                if err.errno == errno.EINVAL:  # already gone (a peer's umount propagated)
                    continue
                try:
                    umount(point, MNT_DETACH)
                except OSError:
                    continue
            removed.append(point)
    return removed


def is_nsfs(path: Path) -> bool:
    """True when ``path`` is a live namespace file (a pin), not a stale plain file."""
    try:
        f_type = _statfs_type(path)
    except OSError:
        return False
    return f_type in (NSFS_MAGIC, PROC_SUPER_MAGIC)


class _Statfs(ctypes.Structure):
    _fields_ = [
        ("f_type", ctypes.c_long),
        ("f_bsize", ctypes.c_long),
        ("f_blocks", ctypes.c_ulong),
        ("f_bfree", ctypes.c_ulong),
        ("f_bavail", ctypes.c_ulong),
        ("f_files", ctypes.c_ulong),
        ("f_ffree", ctypes.c_ulong),
        ("f_fsid", ctypes.c_int * 2),
        ("f_namelen", ctypes.c_long),
        ("f_frsize", ctypes.c_long),
        ("f_flags", ctypes.c_long),
        ("f_spare", ctypes.c_long * 4),
    ]


def _statfs_type(path: Path) -> int:
    buf = _Statfs()
    rc = _libc().statfs(str(path).encode(), ctypes.byref(buf))
    _check(int(rc), "statfs", str(path))
    return int(buf.f_type)


NsId = tuple[int, int]


def ns_id(path: Path | str) -> NsId | None:
    """(st_dev, st_ino) of a namespace file; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def read_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def read_environ(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, Z, ...); None when the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    """Running, not a zombie (this machine's init reaps orphans late)."""
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def wait_gone(pids_: Iterable[int], timeout: float) -> list[int]:
    """Wait until no pid is alive; return those still alive at the deadline."""
    pending = list(pids_)
    deadline = time.monotonic() + timeout
    while True:
        pending = [p for p in pending if alive(p)]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.02)


def kill_all(pids_: Iterable[int], sig: signal.Signals = signal.SIGKILL) -> None:
    for pid in pids_:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
