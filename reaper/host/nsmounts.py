"""Network namespaces held by mounts: every mount namespace's nsfs mounts, read from /proc.

A network namespace lives while a process is in it, an fd holds it, or it is mounted on a file
somewhere. The runtimes' pins are such mounts in the netns dirs; a mount made anywhere else, in
any mount namespace (a container given the pin dir with private propagation, a process that
bind-mounted `/proc/<pid>/ns/net` in a mount namespace of its own: containerd#3667, moby#27277,
cri-o#4210), keeps the namespace, its veths and its addresses alive after its pin is gone, and
the reaper can neither see it in the netns dirs nor free it: it never unmounts anything outside
its netns dirs.

So every mount namespace's `mountinfo` is read once (through one of its processes, or threads:
a thread may have one of its own; the namespace told by the stat of `/proc/<pid>/ns/mnt`), and
each mount of a network namespace (fstype nsfs, or proc on kernels before nsfs; root
`net:[INODE]`) is recorded with the namespace's key (the device of the mount, which is nsfs'
own, and the inode: what `stat()` of `/proc/<pid>/ns/net` gives), a process that reaches it,
its mount namespace and its mount point.

What counts as a pin and not a holder: a mount in the reaper's own mount namespace directly
inside a netns dir, and every mount of the same namespace on the same file in other mount
namespaces (copies of the pin: the kernel detaches them when the pin's file is unlinked, as
the runtime's own removal of its pin does). A mount is told to be on that file by the file it
sits on: its parent mount's device and the path inside that filesystem, which every copy of a
mount tree shares whatever it is mounted under.

A mount namespace pinned on a file with no process in it (snapd keeps one per snap) is entered
to be read, with nsenter and this node's cat run by fd; its mounts are reported with no pid.

The walk is whole or it raises OSError: /proc cannot be listed or does not list this process,
a mount namespace cannot be read (other than by its processes having exited, which takes its
mounts with it), one is over its bounds, too many of them, or one pinned with no process in it
cannot be entered (or pins yet another). A partial answer would let a held namespace look free.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping

from msgspec import Struct

from reaper.host.mounts import MountLine, parse_line
from reaper.host.procs import EveryNamespaceBusy, busy_namespaces
from reaper.model import NsKey

MAX_MOUNT_NAMESPACES = 20_000  # distinct mount namespaces read in one walk
MAX_LINES = 200_000  # mounts of one mount namespace (the kernel's default mount-max is 100,000)
MAX_LINE = 64 * 1024  # bytes of one mountinfo line (two escaped PATH_MAX paths fit many times)
MAX_MOUNTINFO_BYTES = 64 * 1024 * 1024  # bytes of one mountinfo file
VANISHED = (errno.ENOENT, errno.ESRCH)  # the process exited: its mount namespace may have too
UNKNOWN_NS = 0  # a mount namespace that cannot be told (no namespace has inode 0)
NO_PROCESS = 0  # the pid of a mount in a mount namespace no process is in
CAT = "/bin/cat"  # run by fd inside a mount namespace no process is in, to print its mountinfo
ENTER_TIMEOUT = 10.0  # seconds to read one such mount namespace

_NS_ROOT = re.compile(r"(net|mnt):\[([0-9]{1,20})\]")
NS_FSTYPES = ("nsfs", "proc")  # proc: namespace files before nsfs (Linux < 3.19)
# Filesystems whose lookups the kernel answers itself. A path to a mount is walked (to reach its
# namespace) only through these: a lookup in FUSE, a network filesystem or anything else may
# wait on a process, which whoever can mount would make the reaper wait on for good.
LOCAL_FSTYPES = frozenset(
    {"tmpfs", "ramfs", "devtmpfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "squashfs", "erofs",
     "overlay", "proc", "sysfs", "nsfs", "cgroup", "cgroup2", "vfat", "devpts", "mqueue", "hugetlbfs", "bpf"}
)  # fmt: skip
MAX_DEPTH = 256  # mounts between a mount and its namespace's root


class NsMount(Struct, frozen=True, kw_only=True):
    """A network namespace mounted on a file in some mount namespace."""

    ns: NsKey  # the network namespace mounted there
    pid: int  # a process of that mount namespace: /proc/<pid>/root reaches the mount
    mount_ns: int  # the mount namespace's inode (mnt:[N])
    mount_point: str  # as that process sees it
    # The file it is mounted on: (device, path inside that filesystem) of its parent mount;
    # None when the parent cannot be told (outside the process's root, say).
    on: tuple[int, str] | None
    # Its path is walked through local filesystems only (LOCAL_FSTYPES): `reach` may be opened.
    reachable: bool = True

    @property
    def reach(self) -> str:
        """A path to the namespace from this process (through the holder's root). Opened only
        when `reachable`; a mount in a mount namespace no process is in has none that opens
        (/proc/0 does not exist)."""
        return f"/proc/{self.pid}/root{self.mount_point}"

    def describe(self) -> str:
        where = f"mount namespace mnt:[{self.mount_ns}]" if self.mount_ns != UNKNOWN_NS else "the mount namespace"
        who = f"pid {self.pid}" if self.pid != NO_PROCESS else "no process in it: it is pinned"
        return f"a mount at {self.mount_point} in {where} ({who})"


def _on(line: MountLine, by_id: Mapping[int, MountLine]) -> tuple[int, str] | None:
    """The file a mount sits on: its parent's device and the path inside the parent's
    filesystem (the parent's root joined with the mount point below the parent's)."""
    parent = by_id.get(line.parent_id)
    if parent is None or parent.mount_id == line.mount_id:
        return None
    base = parent.point.rstrip("/")
    if not line.point.startswith(base + "/"):
        return None
    return parent.dev, os.path.normpath(parent.root.rstrip("/") + line.point[len(base) :])


class MountInfo(Struct, frozen=True):
    """One mount namespace's mounts of namespaces: of network namespaces, and the mount
    namespaces pinned there (whose mounts no process may show)."""

    net: tuple[tuple[MountLine, tuple[int, str] | None, bool], ...]  # (mount, the file it is on, reachable)
    pinned_mount_namespaces: tuple[tuple[int, str, bool], ...]  # (inode, mount point, reachable)


def parse_mountinfo(lines: Iterable[str], where: str = "mountinfo") -> MountInfo:
    """The namespace mounts of one mountinfo; OSError past the bounds."""
    by_id: dict[int, MountLine] = {}
    wanted: list[tuple[MountLine, str]] = []
    total = 0
    for count, line in enumerate(lines, 1):
        total += len(line)
        if count > MAX_LINES or len(line) > MAX_LINE or total > MAX_MOUNTINFO_BYTES:
            raise OSError(errno.EFBIG, f"{where} is over its bounds ({MAX_LINES} mounts, {MAX_LINE} bytes a line)")
        parsed = parse_line(line)
        if parsed is None:
            continue
        by_id[parsed.mount_id] = parsed
        if parsed.fstype in NS_FSTYPES:
            found = _NS_ROOT.fullmatch(parsed.root)
            if found is not None:
                wanted.append((parsed, found[1]))
    net, pinned = [], []
    for parsed, ns_type in wanted:
        if ns_type == "net":
            net.append((parsed, _on(parsed, by_id), _local_path(parsed, by_id)))
        else:
            pinned.append((int(parsed.root[5:-1]), parsed.point, _local_path(parsed, by_id)))
    return MountInfo(tuple(net), tuple(pinned))


def _local_path(line: MountLine, by_id: Mapping[int, MountLine]) -> bool:
    """Whether every mount a walk of the path to `line` goes through (its parent, and theirs,
    up to the namespace's root) is of a local filesystem."""
    parent = by_id.get(line.parent_id)
    for _ in range(MAX_DEPTH):
        if parent is None:
            return True  # above the root this namespace shows
        if parent.fstype not in LOCAL_FSTYPES:
            return False
        if parent.parent_id == parent.mount_id:
            return True
        parent = by_id.get(parent.parent_id)
    return False


def _read_lines(path: str) -> Iterator[str]:
    """The lines of a /proc file, read as they come (a huge one is refused by the parser
    before it is all in memory)."""
    with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        while True:
            line = f.readline(MAX_LINE + 1)
            if not line:
                return
            yield line


def _mount_ns(base: str) -> int | None:
    """The inode of the process's mount namespace; None when it has exited (or is a zombie);
    UNKNOWN_NS when it may not be looked at (a protected init), though its mountinfo may."""
    try:
        return os.stat(f"{base}/ns/mnt").st_ino
    except OSError as err:
        if err.errno in VANISHED:
            return None
        if err.errno in (errno.EACCES, errno.EPERM):
            return UNKNOWN_NS
        raise


def netns_mounts(proc: str = "/proc") -> list[NsMount]:
    """Every mount of a network namespace in every mount namespace some process is in.
    OSError when the walk cannot be whole (see the module's docstring)."""
    entries = os.listdir(proc)
    pids = sorted((entry for entry in entries if entry.isdigit()), key=int)
    if not pids:
        raise OSError(errno.EIO, f"{proc} lists no process")
    if str(os.getpid()) not in pids:
        raise OSError(errno.EIO, f"{proc} does not list this process (pid {os.getpid()})")
    read: set[int] = set()
    pinned: dict[int, str] = {}  # mount namespaces pinned on a file: how to reach each ("": none safe)
    found: list[NsMount] = []
    for base, task in (task for pid in pids for task in _tasks(proc, pid)):
        mount_ns = _mount_ns(base)
        if mount_ns is None or (mount_ns in read and mount_ns != UNKNOWN_NS):
            continue
        if len(read) >= MAX_MOUNT_NAMESPACES:
            raise OSError(errno.E2BIG, f"more than {MAX_MOUNT_NAMESPACES} mount namespaces")
        try:
            info = parse_mountinfo(_read_lines(f"{base}/mountinfo"), f"{base}/mountinfo")
        except OSError as err:
            if err.errno in VANISHED:
                continue  # exited: another process of its mount namespace is read, if any is left
            raise
        if _mount_ns(base) != mount_ns:
            continue  # it moved to another mount namespace while read: read through another pid
        # One that cannot be told is read through each of its processes: it may be any.
        read.add(mount_ns if mount_ns != UNKNOWN_NS else -task)
        for ino, point, reachable in info.pinned_mount_namespaces:
            pinned.setdefault(ino, f"{proc}/{task}/root{point}" if reachable else "")
        found.extend(_net_mounts(info, task, mount_ns))
    # A mount namespace pinned on a file with no process in it (snapd keeps its snaps' so) holds
    # its mounts all the same: it is entered to be read.
    for ino, path in sorted(pinned.items()):
        if ino in read:
            continue
        if len(read) >= MAX_MOUNT_NAMESPACES:
            raise OSError(errno.E2BIG, f"more than {MAX_MOUNT_NAMESPACES} mount namespaces")
        if not path:
            raise OSError(errno.EIO, f"mount namespace mnt:[{ino}] is pinned only below a filesystem not walked")
        info = parse_mountinfo(read_entered(path, ino).splitlines(keepends=True), f"mount namespace mnt:[{ino}]")
        if any(inner not in read and inner not in pinned for inner, _, _ in info.pinned_mount_namespaces):
            raise OSError(errno.EIO, f"mount namespace mnt:[{ino}], pinned with no process in it, pins another")
        read.add(ino)
        found.extend(_net_mounts(info, NO_PROCESS, ino))
    return found


def _tasks(proc: str, pid: str) -> Iterator[tuple[str, int]]:
    """(/proc dir, id) of the process, then of each of its other threads: a thread may have a
    mount namespace of its own (unshare(CLONE_NEWNS) in one thread), and its mounts hold as
    much. A thread's id reaches it as a pid does (/proc/<tid>, unlisted)."""
    base = f"{proc}/{pid}"
    yield base, int(pid)
    try:
        # The task dir's link count is 2 + its threads: listed only when there are several.
        tids = os.listdir(f"{base}/task") if os.stat(f"{base}/task").st_nlink > 3 else []
    except OSError:
        return  # exited: its threads with it
    for tid in tids:
        if tid != pid and tid.isdigit():
            yield f"{base}/task/{tid}", int(tid)


def _net_mounts(info: MountInfo, pid: int, mount_ns: int) -> Iterator[NsMount]:
    for line, on, reachable in info.net:
        ns = NsKey(line.dev, int(line.root[5:-1]))
        yield NsMount(ns=ns, pid=pid, mount_ns=mount_ns, mount_point=line.point, on=on, reachable=reachable)


def read_entered(path: str, ino: int) -> str:
    """The mountinfo of the mount namespace mounted at `path` (inode `ino`), read from inside it:
    nsenter enters it through an fd checked to be that namespace, and this node's cat, run by
    fd (nothing of the namespace's own files is run), prints its /proc/self/mountinfo. OSError
    when it cannot be read, whole and within the bounds."""
    ns_fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(ns_fd).st_ino != ino:
            raise OSError(errno.ESTALE, f"another namespace is at {path} now")
        cat_fd = os.open(CAT, os.O_PATH | os.O_CLOEXEC)
        try:
            fd_dir = "/proc/self/fd"
            argv = ["nsenter", f"--mount={fd_dir}/{ns_fd}", "--", f"{fd_dir}/{cat_fd}", "/proc/self/mountinfo"]
            try:
                done = subprocess.run(
                    argv, pass_fds=(ns_fd, cat_fd), capture_output=True, timeout=ENTER_TIMEOUT, check=False
                )
            except subprocess.TimeoutExpired as err:
                raise OSError(errno.ETIMEDOUT, f"reading mount namespace mnt:[{ino}] timed out") from err
        finally:
            os.close(cat_fd)
    finally:
        os.close(ns_fd)
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise OSError(errno.EIO, f"mount namespace mnt:[{ino}] cannot be entered: {why[0][:200]}")
    if len(done.stdout) > MAX_MOUNTINFO_BYTES:
        raise OSError(errno.EFBIG, f"mount namespace mnt:[{ino}] has a mountinfo over its bounds")
    return done.stdout.decode(errors="surrogateescape")


def own_mount_namespace(proc: str = "/proc") -> int:
    return os.stat(f"{proc}/{os.getpid()}/ns/mnt").st_ino


def held_elsewhere(
    mounts: Iterable[NsMount], netns_dirs: Iterable[str], own_mount_ns: int
) -> dict[NsKey, tuple[NsMount, ...]]:
    """The namespaces mounts hold outside the netns dirs, with those mounts. A pin is a mount in
    `own_mount_ns` directly inside a netns dir (`netns_dirs` as this process resolves them);
    the same namespace mounted on the same file in another mount namespace is that pin too."""
    dirs = {os.path.realpath(d) for d in netns_dirs}
    mounts = list(mounts)
    pins = {(m.on, m.ns) for m in mounts if m.mount_ns == own_mount_ns and os.path.dirname(m.mount_point) in dirs}
    held: dict[NsKey, list[NsMount]] = {}
    for m in mounts:
        if m.on is not None and (m.on, m.ns) in pins:
            continue
        held.setdefault(m.ns, []).append(m)
    return {ns: tuple(sorted(found, key=_reachable_first)) for ns, found in held.items()}


def _reachable_first(mount: NsMount) -> tuple[bool, bool, int]:
    """Mounts in a mount namespace that could be told first (a process that may not be looked
    at, a protected init, has a root this process may not walk either), then by pid; those in
    one no process is in last."""
    return (mount.pid == NO_PROCESS, mount.mount_ns == UNKNOWN_NS, mount.pid)


def pin_files_shared(mounts: Iterable[NsMount], netns_dirs: Iterable[str], own_mount_ns: int) -> dict[NsKey, str]:
    """Pins whose file carries a mount of another namespace in another mount namespace:
    unlinking that file would detach that mount, so the pin's namespace must stay."""
    dirs = {os.path.realpath(d) for d in netns_dirs}
    mounts = list(mounts)
    pins = {m.on: m.ns for m in mounts if m.mount_ns == own_mount_ns and os.path.dirname(m.mount_point) in dirs}
    shared: dict[NsKey, str] = {}
    for m in mounts:
        pin_ns = pins.get(m.on) if m.on is not None else None
        if pin_ns is not None and pin_ns != m.ns:
            shared.setdefault(pin_ns, f"its pin's file carries another namespace's mount: {m.describe()}")
    return shared


def mount_held(netns_dirs: tuple[str, ...], proc: str = "/proc") -> Mapping[NsKey, str]:
    """Namespaces a mount holds outside the netns dirs right now (and pins whose file another
    namespace is mounted on), with why. When the walk cannot be whole, every namespace is
    (EveryNamespaceBusy)."""
    try:
        mounts = netns_mounts(proc)
        own = own_mount_namespace(proc)
    except OSError as err:
        return EveryNamespaceBusy(f"the mounts that may hold its netns cannot all be read now ({err})")
    busy = pin_files_shared(mounts, netns_dirs, own)
    for ns, found in held_elsewhere(mounts, netns_dirs, own).items():
        busy[ns] = f"its netns is held by {found[0].describe()}; never unmounted by the reaper"
    return busy


def in_use(bin_dirs: tuple[str, ...], netns_dirs: tuple[str, ...], only: NsKey | None = None) -> Mapping[NsKey, str]:
    """Namespaces that must stay right now, with why: some process is in them
    (reaper.host.procs.busy_namespaces; `only`: just that namespace's processes are described)
    or a mount holds them outside the netns dirs (mount_held). Either walk failing makes every
    namespace stay."""
    busy = busy_namespaces(bin_dirs, only)
    if isinstance(busy, EveryNamespaceBusy):
        return busy
    held = mount_held(netns_dirs)
    if isinstance(held, EveryNamespaceBusy):
        return held
    return {**held, **busy}
