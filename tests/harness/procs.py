"""Stand-in /proc trees: a host's pid 1, and processes it could have started."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def host_proc(proc: Path, host_root: Path) -> None:
    """A /proc whose pid 1 has `host_root` for its root and this process's mount namespace."""
    (proc / "1" / "ns").mkdir(parents=True)
    (proc / "1" / "root").symlink_to(host_root)
    (proc / "1" / "ns" / "mnt").symlink_to("/proc/self/ns/mnt")


def believed_process(proc: Path, pid: int, host_root: Path, argv: list[str], uid: int = 0) -> None:
    """A process as pid 1 would have started it (named argv[0]'s base name): root (unless
    `uid`), pid 1's root and mount namespace, and a root-owned executable (the interpreter's)."""
    comm = os.path.basename(argv[0])
    (proc / str(pid) / "ns").mkdir(parents=True)
    (proc / str(pid) / "comm").write_bytes(comm.encode() + b"\n")
    (proc / str(pid) / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (proc / str(pid) / "status").write_bytes(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n".encode())
    (proc / str(pid) / "root").symlink_to(host_root)
    (proc / str(pid) / "ns" / "mnt").symlink_to("/proc/self/ns/mnt")
    (proc / str(pid) / "exe").symlink_to(os.path.realpath(sys.executable))
