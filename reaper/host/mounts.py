"""Mount namespaces and propagation: whether a pin that looks stale here is stale everywhere."""

from __future__ import annotations

import os

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


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def propagation_of(path: str, mountinfo: str) -> set[str]:
    """The propagation tags (shared:N, master:N, ...) of the mount that holds `path`: the one with
    the longest mount point, and of mounts stacked on one point the last (the one on top)."""
    best: tuple[int, set[str]] = (-1, set())
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        point = _unescape(fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best[0]:
            best = (len(point), {f.split(":")[0] for f in fields[6 : fields.index("-", 6)]})
    return best[1]


def unpin_hazard(netns_dirs: tuple[str, ...]) -> str | None:
    """Why unlinking a pin here could remove a live one elsewhere, or None when it cannot: not in
    the host's mount namespace, with no mounts propagating from it into a netns dir, a pin that
    looks stale here may be a live namespace's mount there."""
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
