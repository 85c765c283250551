"""Mount-namespace helper run as a script between `unshare --mount` and containerd.

    python nsexec.py --keep-shared DIR [--bind SRC:DST ...] -- PROGRAM ARGS...

It runs as the first process of a fresh mount namespace (a copy of the host's). It makes every
shared mount private except the ``--keep-shared`` ones, so nothing mounted here reaches the host
but what is mounted under a kept mount (the lab's netns pin dir), then bind-mounts each
SRC over DST (the lab's own /var/lib and /run) and execs PROGRAM, which keeps this pid.

Standalone on purpose (stdlib only, no package import): it is started by path, and the mount
syscalls are made directly because mount(8) would write libmount's utab under the host's /run.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys

MS_BIND = 0x1000
MS_PRIVATE = 1 << 18


def _mount(source: str | None, target: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(
        source.encode() if source is not None else None,
        target.encode(),
        None,
        ctypes.c_ulong(flags),
        None,
    )
    if int(rc) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def _shared_mount_points() -> list[str]:
    points: list[str] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split(" ")
            optional = fields[6 : fields.index("-")]
            if any(o.startswith("shared:") for o in optional):
                points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def main(argv: list[str]) -> int:
    keep: set[str] = set()
    binds: list[tuple[str, str]] = []
    args = list(argv)
    while args and args[0] != "--":
        opt = args.pop(0)
        if not args:
            print(f"nsexec: {opt} needs a value", file=sys.stderr)
            return 2
        value = args.pop(0)
        if opt == "--keep-shared":
            keep.add(os.path.realpath(value))
        elif opt == "--bind":
            src, _, dst = value.partition(":")
            binds.append((src, dst))
        else:
            print(f"nsexec: unknown option {opt}", file=sys.stderr)
            return 2
    command = args[1:]
    if not command:
        print("nsexec: no program after --", file=sys.stderr)
        return 2
    for point in _shared_mount_points():
        if os.path.realpath(point) not in keep:
            _mount(None, point, MS_PRIVATE)
    for src, dst in binds:
        _mount(src, dst, MS_BIND)
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
