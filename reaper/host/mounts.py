"""Mount namespaces and propagation: whether a pin that looks stale here is stale everywhere.
Also the one reader of the mountinfo format (parse_line), for reaper.host.nsmounts too.
"""

from __future__ import annotations

import os
import re

from msgspec import Struct

INIT_TASKS = ("1", "2")  # init, else kthreadd: always in the host's namespaces


def _namespace(pid: str, kind: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def in_host_mount_namespace() -> bool:
    mine = _namespace("self", "mnt")
    return mine is not None and any(_namespace(pid, "mnt") == mine for pid in INIT_TASKS)


_ESCAPE = re.compile(r"\\([0-7]{3})")


class MountLine(Struct, frozen=True, gc=False):
    """The fields of one line of /proc/<pid>/mountinfo the reaper uses."""

    mount_id: int
    parent_id: int
    dev: int  # of the mounted filesystem (st_dev of what is on it)
    root: str  # the path inside that filesystem that is mounted (`net:[N]` for a namespace)
    point: str  # where, as the reading process sees it
    tags: tuple[str, ...]  # propagation: shared:N, master:N, propagate_from:N, unbindable
    fstype: str


def unescape(field: str) -> str:
    """mountinfo's octal escapes (space, tab, newline, backslash) back to characters."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field) if "\\" in field else field


def parse_line(line: str) -> MountLine | None:
    """One mountinfo line, or None when it is not one (too few fields, no separator, bad numbers)."""
    fields = line.rstrip("\n").split(" ")
    if len(fields) < 10 or "-" not in fields[6:]:
        return None
    sep = fields.index("-", 6)
    if sep + 1 >= len(fields):
        return None
    major, _, minor = fields[2].partition(":")
    try:
        mount_id, parent_id, dev = int(fields[0]), int(fields[1]), os.makedev(int(major), int(minor))
    except (ValueError, OverflowError):
        return None
    return MountLine(
        mount_id, parent_id, dev, unescape(fields[3]), unescape(fields[4]), tuple(fields[6:sep]), fields[sep + 1]
    )


def propagation_of(path: str, mountinfo: str) -> set[str]:
    """The propagation tags (shared:N, ...) of the mount holding `path`: the longest mount point,
    and of mounts stacked on one point the last (on top)."""
    best: tuple[int, set[str]] = (-1, set())
    for line in mountinfo.splitlines():
        parsed = parse_line(line)
        if parsed is None:
            continue
        point = parsed.point
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best[0]:
            best = (len(point), {tag.split(":")[0] for tag in parsed.tags})
    return best[1]


def unpin_hazard(netns_dirs: tuple[str, ...]) -> str | None:
    """Why unlinking a pin here could remove a live one elsewhere (outside the host's mount
    namespace with no propagation into a netns dir, a stale-looking pin may be live there)."""
    if in_host_mount_namespace():
        return None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mountinfo = f.read()
    except OSError as err:
        return f"not in the host's mount namespace and /proc/self/mountinfo cannot be read ({err.strerror})"
    for directory in netns_dirs:
        tags = propagation_of(os.path.realpath(directory), mountinfo)
        if not tags & {"shared", "master"}:
            return (
                f"not in the host's mount namespace, and mounts under {directory} do not propagate here "
                "(mount it with Bidirectional or HostToContainer propagation): pins are never unlinked"
            )
    return None
