"""Network namespaces held by mounts: every mount namespace's nsfs mounts, read from /proc.

A mount of a network namespace outside the netns dirs, in any mount namespace (containerd#3667,
moby#27277, cri-o#4210), keeps it, its veths and addresses alive after its pin is gone, and the
reaper never unmounts it. So every mount namespace's mountinfo is read once: through one of its
processes or threads, or, pinned on a file with no process in it, through a forked child that
joins it and runs nothing (`entered`). A pin (a mount in this mount namespace directly in a netns
dir) and its copies on the same file elsewhere are no holders. The walk is whole or raises
OSError, as a partial one would let a held namespace look free; but a mount namespace an
unprivileged user made that cannot be read is left out (HeldMounts.unread), so that no user can
stop reclaiming for good. Why each rule: docs/design.md, "In depth: mounts, netlink and /proc";
SECURITY.md, "Mounts in a mount namespace of its own" and "Pinned mount namespaces".
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import hashlib
import logging
import os
import re
import select
import signal
import stat
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import NoReturn

from msgspec import Struct

from reaper.host.confined import libc, open_path_in_root
from reaper.host.mounts import MountLine, parse_line
from reaper.host.pins import nsfs_device
from reaper.host.procs import EveryNamespaceBusy, busy_namespaces, listed_pids, tasks
from reaper.host.userns import owners_at, owners_of
from reaper.model import NsKey

MAX_MOUNT_NAMESPACES = 20_000  # distinct root-made mount namespaces read in one walk
MAX_USER_MOUNT_NAMESPACES = 2_000  # and unprivileged users' (past it, theirs are left out)
MAX_NOTES = 20  # what was left out, named one by one; the rest counted
MAX_LINES = 200_000  # mounts of one mount namespace (the kernel's default mount-max is 100,000)
MAX_LINE = 64 * 1024  # bytes of one mountinfo line (two escaped PATH_MAX paths fit many times)
MAX_MOUNTINFO_BYTES = 64 * 1024 * 1024  # bytes of one mountinfo file
READ_SIZE = 1024 * 1024  # bytes asked of the kernel in one read of a mountinfo
HEAD_MIN_BYTES = 16 * 1024  # a text shorter than this is read whole for each task (_Heads)
MAX_HEADS = 64  # mountinfo files a walk holds open for their first lines (_Heads)
VANISHED = (errno.ENOENT, errno.ESRCH)  # the process exited: its mount namespace may have too
UNKNOWN_NS = 0  # a mount namespace that cannot be told (no namespace has inode 0)
NO_PROCESS = 0  # the pid of a mount in a mount namespace no process is in
ENTER_TIMEOUT = 10.0  # seconds a child gets to join a mount namespace no process is in
CLONE_NEWNS = 0x00020000
CLONE_FS = 0x00000200
_ALL_SIGNALS = signal.valid_signals()
log = logging.getLogger(__name__)

_NS_ROOT = re.compile(r"(net|mnt):\[([0-9]{1,20})\]")
NS_FSTYPES = ("nsfs", "proc")  # proc: namespace files before nsfs (Linux < 3.19)
# The only filesystems a path to a mount is walked through: their lookups are the kernel's own
# (binfmt_misc, user-mountable since 6.7: fs/binfmt_misc.c bm_fill_super, fs/libfs.c
# simple_fill_super); one in FUSE or a network filesystem may wait on a process for good.
LOCAL_FSTYPES = frozenset(
    {"tmpfs", "ramfs", "devtmpfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "squashfs", "erofs",
     "overlay", "proc", "sysfs", "nsfs", "cgroup", "cgroup2", "vfat", "devpts", "mqueue", "hugetlbfs", "bpf",
     "binfmt_misc", "securityfs", "debugfs", "tracefs", "configfs", "pstore"}
)  # fmt: skip
MAX_DEPTH = 256  # mounts between a mount and its namespace's root


class NsMount(Struct, frozen=True, kw_only=True):
    """A network namespace mounted on a file in some mount namespace."""

    ns: NsKey  # the network namespace mounted there
    pid: int  # a process of that mount namespace: /proc/<pid>/root reaches the mount
    mount_ns: int  # the mount namespace's inode (mnt:[N])
    mount_point: str  # as that process sees it
    on: tuple[int, str] | None  # the file it is on: its parent's (device, path inside); None: unknown
    reachable: bool = True  # its path crosses LOCAL_FSTYPES only: `reach` may be opened
    # The maker's uid, if a user without root, of a mount namespace no process is in (no pid to
    # ask later); None: root's, or to be asked through `pid`.
    made_by_user: int | None = None

    @property
    def reach(self) -> str:
        """A path to the namespace through the holder's root; opened only when `reachable`."""
        return f"/proc/{self.pid}/root{self.mount_point}"

    def describe(self) -> str:
        where = f"mount namespace mnt:[{self.mount_ns}]" if self.mount_ns != UNKNOWN_NS else "the mount namespace"
        who = f"pid {self.pid}" if self.pid != NO_PROCESS else "no process in it: it is pinned"
        return f"a mount at {self.mount_point} in {where} ({who})"


def _on(line: MountLine, by_id: Mapping[int, MountLine]) -> tuple[int, str] | None:
    """The file a mount sits on: its parent's device and the path inside the parent's filesystem,
    which every copy of the mount tree shares wherever it is mounted."""
    parent = by_id.get(line.parent_id)
    if parent is None or parent.mount_id == line.mount_id:
        return None
    base = parent.point.rstrip("/")
    if not line.point.startswith(base + "/"):
        return None
    return parent.dev, os.path.normpath(parent.root.rstrip("/") + line.point[len(base) :])


class MountInfo(Struct, frozen=True):
    """One mount namespace's mounts of network namespaces, and the mount namespaces pinned there."""

    net: tuple[tuple[MountLine, tuple[int, str] | None, bool], ...]  # (mount, the file it is on, reachable)
    pinned_mount_namespaces: tuple[tuple[int, str, bool], ...]  # (inode, mount point, reachable)
    net_ns: tuple[NsKey, ...]  # the namespace each of `net` mounts, in the same order

    def nets(self) -> Iterator[_NetLine]:
        return zip(self.net, self.net_ns, strict=True)


def parse_mountinfo(lines: Iterable[str], where: str = "mountinfo") -> MountInfo:
    """The namespace mounts of one mountinfo; OSError past the bounds."""
    by_id: dict[int, MountLine] = {}
    wanted: list[tuple[MountLine, str, int]] = []
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
                wanted.append((parsed, found[1], int(found[2])))
    net, net_ns, pinned = [], [], []
    for parsed, ns_type, ino in wanted:
        if ns_type == "net":
            net.append((parsed, _on(parsed, by_id), _local_path(parsed, by_id)))
            net_ns.append(NsKey(parsed.dev, ino))  # a namespace file is on nsfs' device
        else:
            pinned.append((ino, parsed.point, _local_path(parsed, by_id)))
    return MountInfo(tuple(net), tuple(pinned), tuple(net_ns))


def _local_path(line: MountLine, by_id: Mapping[int, MountLine]) -> bool:
    """Whether every mount above `line`, up to the namespace's root, is of LOCAL_FSTYPES."""
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


def _read_text(path: str) -> bytes:
    """A /proc file whole; OSError (EFBIG) past MAX_MOUNTINFO_BYTES, before more is held."""
    text, fd = _read_open(path)
    os.close(fd)
    return text


def _read_open(path: str) -> tuple[bytes, int]:
    """_read_text, and the file still open (the caller closes it)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    chunks: list[bytes] = []
    total = 0
    try:
        while chunk := os.read(fd, READ_SIZE):
            total += len(chunk)
            if total > MAX_MOUNTINFO_BYTES:
                raise OSError(errno.EFBIG, f"{path} is over its bounds ({MAX_MOUNTINFO_BYTES} bytes)")
            chunks.append(chunk)
    except BaseException:
        os.close(fd)
        raise
    return b"".join(chunks), fd


def _first_line(text: bytes) -> bytes | None:
    line, newline, _ = text.partition(b"\n")
    return line if newline else None


class _Heads:
    """First lines of root-made namespaces' texts, each mountinfo held open: a task whose mount
    namespace cannot be told is not read whole if one shows its line before and after (a live
    mount's ID: docs/design.md, "Telling a task's mount namespace by its first line")."""

    def __init__(self) -> None:
        self._held: dict[bytes, int] = {}
        self._clashed: set[bytes] = set()

    def keep(self, text: bytes, fd: int) -> bool:
        """Hold `fd` (the mountinfo `text` was read from) for its first line; False (the caller
        closes it) for a short text, past MAX_HEADS, or a line seen before."""
        line = _first_line(text)
        if line is None or len(text) < HEAD_MIN_BYTES or len(self._held) >= MAX_HEADS:
            return False
        if line in self._clashed or line in self._held:
            self._clashed.add(line)
            with contextlib.suppress(KeyError):
                os.close(self._held.pop(line))
            return False
        self._held[line] = fd
        return True

    def in_one_read(self, base: str) -> bool:
        """Whether the task at `base` is in a namespace whose text this walk read (its first
        line shown by a held file after this read too); False: it is read whole."""
        if not self._held:
            return False
        try:
            with open(f"{base}/mountinfo", "rb", buffering=0) as file:  # one read(2), as os.read
                line = _first_line(file.read(MAX_LINE + 1))
        except OSError:
            return False
        held = self._held.get(line) if line is not None else None
        if held is None:
            return False
        try:
            os.lseek(held, 0, os.SEEK_SET)
            return _first_line(os.read(held, MAX_LINE + 1)) == line
        except OSError:
            return False

    def close(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()


def _lines(text: bytes) -> Iterator[str]:
    """The lines of a mountinfo text, each with its newline: split at newlines only (a mount point
    may hold any other character; the kernel escapes only space, tab, newline and backslash)."""
    lines = text.decode("utf-8", "surrogateescape").split("\n")
    last = lines.pop()
    for line in lines:
        yield line + "\n"
    if last:
        yield last


class ParsedMountinfo:
    """Each mountinfo text parsed once, by a digest of the whole text (a text read again: an
    untold thread's, or one unchanged since the last walk). Kept from walk to walk by a
    long-running caller; texts not seen in a walk are forgotten at its end."""

    def __init__(self) -> None:
        self._last: dict[bytes, MountInfo] = {}
        self._now: dict[bytes, MountInfo] = {}

    def parse(self, text: bytes, where: str, *, remember: bool = True) -> MountInfo:
        """The text parsed; `remember` False (a user's mount namespace) keeps nothing of it."""
        key = hashlib.blake2b(text, digest_size=32).digest()
        info = self._now.get(key) or self._last.get(key) or parse_mountinfo(_lines(text), where)
        if remember:
            self._now[key] = info
        return info

    def end_walk(self) -> None:
        self._last, self._now = self._now, {}


def _mount_ns(base: str) -> int | None:
    """The inode of the process's mount namespace; None: exited (or a zombie); UNKNOWN_NS: it
    may not be looked at (a protected init), though its mountinfo may."""
    try:
        return os.stat(f"{base}/ns/mnt").st_ino
    except OSError as err:
        if err.errno in VANISHED:
            return None
        if err.errno in (errno.EACCES, errno.EPERM):
            return UNKNOWN_NS
        raise


def _exited(err: OSError, base: str) -> bool:
    """Whether reading the task at `base` failed because it exited: ENOENT or ESRCH, or EINVAL,
    which opening the mountinfo of a task past exit_task_namespaces gives (`fs/proc_namespace.c`
    `mounts_open_common`: no nsproxy), once its ns/mnt shows it gone too."""
    if err.errno in VANISHED:
        return True
    return err.errno == errno.EINVAL and _mount_ns(base) is None


class _Pinned(Struct, kw_only=True):
    """A mount namespace pinned on a file: the ways to open it (a process's root, the mount point
    beneath it), or an fd opened already (while a child was in the namespace holding the pin),
    or why it cannot be."""

    ways: list[tuple[str, str]]
    fd: int | None = None
    why: str = ""
    users: list[bool]  # for each mount namespace it is pinned in: whether a user without root made it

    def open(self, ino: int) -> int | None:
        for root, point in self.ways:
            try:
                self.fd = open_pin(root, point, ino)
                break
            except OSError as err:
                self.why = f"{point}: {err.strerror or err}"
        return self.fd


class _View(Struct, frozen=True):
    """One mount namespace's mounts as read through task `pid` (NO_PROCESS: pinned with no process
    in it, made by user `maker` if one without root)."""

    info: MountInfo
    pid: int
    mount_ns: int
    maker: int | None = None


def _walk(proc: str, parsed: ParsedMountinfo) -> tuple[list[_View], tuple[str, ...]]:
    """Each mount namespace's view, in the order read, and the notes of what was left out."""
    pids = sorted(listed_pids(proc), key=int)
    read: set[int] = set()
    pins: dict[int, _Pinned] = {}  # mount namespaces pinned on a file
    views: list[_View] = []
    tally = _Tally()
    heads = _Heads()
    untold: list[tuple[str, int]] = []  # tasks whose mount namespace cannot be told

    def read_task(base: str, task: int, mount_ns: int) -> None:
        users = _users_at(base, mount_ns)
        what = f"mount namespace mnt:[{mount_ns}] of pid {task}"
        if not tally.take(users=users, what=what):
            read.add(mount_ns)
            return
        path, fd = f"{base}/mountinfo", -1
        try:
            text, fd = _read_open(path)
            info = parsed.parse(text, path, remember=not users)
        except OSError as err:
            if fd >= 0:
                os.close(fd)
            if _exited(err, base):
                return  # exited: another process of its mount namespace is read, if any is left
            if not users:
                raise
            read.add(mount_ns)
            tally.leave(what, str(err))
            return
        held = False
        try:
            if _mount_ns(base) != mount_ns:
                return  # it moved to another mount namespace while read: read through another pid
            held = mount_ns != UNKNOWN_NS and not users and heads.keep(text, fd)
        finally:
            if not held:
                os.close(fd)
        # One that cannot be told is read through each of its processes: it may be any.
        read.add(mount_ns if mount_ns != UNKNOWN_NS else -task)
        for ino, point, reachable in info.pinned_mount_namespaces:
            pin = pins.setdefault(ino, _Pinned(ways=[], users=[], why="below a filesystem not walked"))
            pin.users.append(users)
            if reachable:
                pin.ways.append((f"{proc}/{task}/root", point))
        views.append(_View(info, task, mount_ns))

    try:
        # Threads too: one may have a mount namespace of its own (unshare(CLONE_NEWNS)).
        for base, task in (task for pid in pids for task in tasks(proc, pid)):
            mount_ns = _mount_ns(base)
            if mount_ns is None or (mount_ns in read and mount_ns != UNKNOWN_NS):
                continue
            if mount_ns == UNKNOWN_NS:
                untold.append((base, task))  # after every namespace that can be told (_Heads)
                continue
            read_task(base, task, mount_ns)
        for base, task in untold:
            if not heads.in_one_read(base):
                read_task(base, task, UNKNOWN_NS)
        # Mount namespaces pinned with no process in them (snapd's), and those pinned in them.
        waiting = sorted(pins)
        while waiting:
            ino = waiting.pop(0)
            if ino in read:
                continue
            read.add(ino)
            pin = pins[ino]
            where = f"mount namespace mnt:[{ino}], pinned with no process in it"
            fd = pin.fd if pin.fd is not None else pin.open(ino)
            if fd is None:
                if not all(pin.users):
                    raise OSError(errno.EIO, f"{where}, cannot be reached: {pin.why}")
                tally.leave(where, f"cannot be reached: {pin.why}")
                continue
            maker = made_by_user(fd)
            users = maker is not None
            if not tally.take(users=users, what=where):
                continue
            try:
                info, inner = _read_pinned(fd, ino, where, parsed, users=users)
            except OSError as err:
                if not users:
                    raise
                tally.leave(where, str(err))
                continue
            for inner_ino, inner_pin in inner.items():
                if inner_ino in read or inner_ino in pins:
                    if inner_pin.fd is not None:
                        os.close(inner_pin.fd)
                    continue
                pins[inner_ino] = inner_pin
                waiting.append(inner_ino)
            views.append(_View(info, NO_PROCESS, ino, maker))
    finally:
        parsed.end_walk()
        heads.close()
        for pin in pins.values():
            if pin.fd is not None:
                os.close(pin.fd)
    return views, tally.notes()


class _Tally(Struct, kw_only=True):
    """Mount namespaces read, root's and users' counted apart (a user can make thousands), and
    the users' left out (named up to MAX_NOTES)."""

    root: int = 0
    users: int = 0
    named: list[str] = []
    more: int = 0

    def take(self, *, users: bool, what: str) -> bool:
        """Whether one more may be read: past its bound a root one fails the walk, a user's is left out."""
        if not users:
            if self.root >= MAX_MOUNT_NAMESPACES:
                raise OSError(errno.E2BIG, f"more than {MAX_MOUNT_NAMESPACES} mount namespaces")
            self.root += 1
            return True
        if self.users >= MAX_USER_MOUNT_NAMESPACES:
            self.leave(what, f"past the {MAX_USER_MOUNT_NAMESPACES} of unprivileged users' a walk reads")
            return False
        self.users += 1
        return True

    def leave(self, what: str, why: str) -> None:
        if len(self.named) < MAX_NOTES:
            self.named.append(f"{what}: {why}")
        else:
            self.more += 1

    def notes(self) -> tuple[str, ...]:
        return (*self.named, f"and {self.more} more") if self.more else tuple(self.named)


def _read_pinned(
    fd: int, ino: int, where: str, parsed: ParsedMountinfo, *, users: bool
) -> tuple[MountInfo, dict[int, _Pinned]]:
    """The mounts of mount namespace `fd` (inode `ino`), read through a child that joined it, and
    the mount namespaces pinned in it, each opened while the child is there."""
    inner: dict[int, _Pinned] = {}
    try:
        with entered(fd, ino) as base:
            info = parsed.parse(_read_text(f"{base}/mountinfo"), where, remember=not users)
            if _mount_ns(base) != ino:
                raise OSError(errno.ESTALE, f"{where} was left while read")
            for inner_ino, point, reachable in info.pinned_mount_namespaces:
                pin = inner.setdefault(inner_ino, _Pinned(ways=[], users=[users], why="below a filesystem not walked"))
                if reachable and pin.fd is None:
                    pin.ways = [(f"{base}/root", point)]
                    pin.open(inner_ino)
                    pin.ways = []  # the child's /proc/<pid> is no way once it is gone
    except BaseException:
        for pin in inner.values():
            if pin.fd is not None:
                os.close(pin.fd)
        raise
    return info, inner


def open_pin(root: str, point: str, ino: int) -> int:
    """An fd (for setns) of the mount namespace at `point` beneath `root` (a process's root),
    walked with no symlink followed, checked to be namespace `ino`; OSError if not."""
    path_fd = open_path_in_root(root, point)
    try:
        st = os.fstat(path_fd)
        if not stat.S_ISREG(st.st_mode) or st.st_ino != ino or st.st_dev != nsfs_device():
            raise OSError(errno.ESTALE, f"another file is at {point} now")
        # Reopened through the checked fd: a namespace reads as an empty regular file.
        return os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    finally:
        os.close(path_fd)


def _users_at(base: str, mount_ns: int) -> bool:
    """Whether mount namespace `mount_ns` of the task at `base` is a user's without root; False
    (fail closed) when that cannot be told."""
    if mount_ns == UNKNOWN_NS:
        return False
    owners = owners_at(f"{base}/ns/mnt", mount_ns)
    return owners is not None and owners.user is not None


def made_by_user(ns_fd: int) -> int | None:
    """The uid of a user without root that made namespace `ns_fd`'s owning user namespace or one
    above it (reaper.host.userns); None: all uid 0, or unknown (before 4.11: fail closed)."""
    try:
        return owners_of(ns_fd).user
    except OSError:
        return None


@contextlib.contextmanager
def entered(ns_fd: int, ino: int) -> Iterator[str]:
    """`/proc/<pid>` of a forked child (not a thread, whose interpreter could run a finalizer
    inside) that joined mount namespace `ns_fd` (inode `ino`) and waits running nothing, killed
    at the end; OSError past ENTER_TIMEOUT (docs/design.md, "Reading a pinned mount namespace")."""
    setns, unshare = libc.setns, libc.unshare  # looked up here, not in the child
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (ready_r, ready_w, release_r, release_w):
            os.close(fd)
        raise
    if pid == 0:  # pragma: no cover - the child, ended by os._exit
        _join_and_wait(setns, unshare, ns_fd, ready_w, release_r, (ready_r, release_w))
    try:
        os.close(ready_w)
        os.close(release_r)
        poll = select.poll()
        poll.register(ready_r, select.POLLIN)
        if not poll.poll(int(ENTER_TIMEOUT * 1000)):
            raise OSError(errno.ETIMEDOUT, f"joining mount namespace mnt:[{ino}] timed out")
        said = os.read(ready_r, 1)
        if said != b"\0":
            code = said[0] if said else errno.EIO
            raise OSError(code, f"mount namespace mnt:[{ino}] cannot be entered: {os.strerror(code)}")
        base = f"/proc/{pid}"
        if _mount_ns(base) != ino:
            raise OSError(errno.ESTALE, f"the child that joined mount namespace mnt:[{ino}] is elsewhere")
        yield base
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        for fd in (ready_r, release_w):
            os.close(fd)


def _join_and_wait(
    setns: Callable[[int, int], int],
    unshare: Callable[[int], int],
    ns_fd: int,
    ready: int,
    release: int,
    parents: tuple[int, ...],
) -> NoReturn:  # pragma: no cover - runs in the forked child
    """The child, with no signal handler or collection left to run: takes a filesystem context of
    its own (a fork handler, gRPC's, may have started a thread, and `mntns_install` refuses a
    shared one), joins, says so (a byte: 0 or the errno), and waits until killed."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, _ALL_SIGNALS)
        gc.disable()
        for fd in parents:
            os.close(fd)
        joined = unshare(CLONE_FS) == 0 and setns(ns_fd, CLONE_NEWNS) == 0
        code = 0 if joined else (ctypes.get_errno() or errno.EIO)
        os.write(ready, bytes((min(code, 255),)))
        if code == 0:
            os.read(release, 1)
    finally:
        os._exit(0)


def _net_mounts(lines: Iterable[_NetLine], pid: int, mount_ns: int, maker: int | None) -> Iterator[NsMount]:
    for (line, on, reachable), ns in lines:
        yield NsMount(
            ns=ns, pid=pid, mount_ns=mount_ns, mount_point=line.point, on=on, reachable=reachable, made_by_user=maker
        )


def _reachable_first(mount: NsMount | _View) -> tuple[bool, bool, int]:
    """Mounts (or views) in a told mount namespace first (an untold task's root may not be walked
    either), then by pid; those in one no process is in last."""
    return (mount.pid == NO_PROCESS, mount.mount_ns == UNKNOWN_NS, mount.pid)


class HeldMounts(Struct, frozen=True, kw_only=True):
    """What a walk found held outside the netns dirs, and the users' mount namespaces it left out."""

    held: dict[NsKey, tuple[NsMount, ...]]  # each namespace's holders, _reachable_first
    # Pins whose file carries another namespace's mount in another mount namespace: unlinking
    # that file would detach that mount, so the pin's namespace must stay.
    shared: dict[NsKey, str]
    unread: tuple[str, ...] = ()


def held_mounts(
    netns_dirs: Iterable[str], proc: str = "/proc", parsed: ParsedMountinfo | None = None, *, first_only: bool = False
) -> HeldMounts:
    """Each network namespace a mount holds, in every mount namespace a process is in or a file
    pins, with those mounts: all but pins (in this mount namespace, directly in a netns dir) and
    their copies on the same file, judged once a distinct text; OSError when the walk cannot be
    whole. `parsed`: a long-running caller's texts parsed before. `first_only`: each namespace
    with its first mount alone, made from the first view of each text only."""
    views, unread = _walk(proc, parsed if parsed is not None else ParsedMountinfo())
    for why in unread:
        log.warning("a user's mount namespace is left out of the mount walk: %s", why)
    own = os.stat(f"{proc}/{os.getpid()}/ns/mnt").st_ino
    dirs = {os.path.realpath(d) for d in netns_dirs}
    pins: set[tuple[tuple[int, str] | None, NsKey]] = set()
    pin_on: dict[tuple[int, str] | None, NsKey] = {}
    for view in views:
        if view.mount_ns == own:
            for (line, on, _), ns in view.info.nets():
                if os.path.dirname(line.point) in dirs:
                    pins.add((on, ns))
                    pin_on[on] = ns
    judged: dict[int, tuple[list[_NetLine], list[_NetLine]]] = {}  # by id() of a parsed text
    held: dict[NsKey, list[NsMount]] = {}
    shared: dict[NsKey, str] = {}
    first = _first_of_each_text(views) if first_only else None
    for view in views:
        if id(view.info) not in judged:
            judged[id(view.info)] = _judge(view.info, pins, pin_on)
        holding, sharing = judged[id(view.info)]
        if first is None or first[id(view.info)] is view:
            for m in _net_mounts(holding, view.pid, view.mount_ns, view.maker):
                held.setdefault(m.ns, []).append(m)
        for m in _net_mounts(sharing, view.pid, view.mount_ns, view.maker):
            # _judge keeps only mounts on a pin's file.
            shared.setdefault(pin_on[m.on], f"its pin's file carries another namespace's mount: {m.describe()}")
    ordered = {ns: tuple(sorted(found, key=_reachable_first)) for ns, found in held.items()}
    return HeldMounts(
        held={ns: found[:1] for ns, found in ordered.items()} if first_only else ordered,
        shared=shared,
        unread=unread,
    )


def _first_of_each_text(views: Iterable[_View]) -> dict[int, _View]:
    """For each parsed text (by id), its view whose mounts _reachable_first puts first (of equals,
    the earliest): no other view of it can give a namespace its first mount."""
    first: dict[int, _View] = {}
    for view in views:
        best = first.get(id(view.info))
        if best is None or _reachable_first(view) < _reachable_first(best):
            first[id(view.info)] = view
    return first


_NetLine = tuple[tuple[MountLine, tuple[int, str] | None, bool], NsKey]  # one of MountInfo.net, its namespace


def _judge(
    info: MountInfo, pins: set[tuple[tuple[int, str] | None, NsKey]], pin_on: Mapping[tuple[int, str] | None, NsKey]
) -> tuple[list[_NetLine], list[_NetLine]]:
    """A text's mounts that are no pin or copy of one (holders), and those on a pin's file of
    another namespace than the pin's."""
    holding, sharing = [], []
    for net, ns in info.nets():
        on = net[1]
        if on is None or (on, ns) not in pins:
            holding.append((net, ns))
        pin_ns = pin_on.get(on) if on is not None else None
        if pin_ns is not None and pin_ns != ns:
            sharing.append((net, ns))
    return holding, sharing


def mount_held(
    netns_dirs: tuple[str, ...], proc: str = "/proc", parsed: ParsedMountinfo | None = None
) -> Mapping[NsKey, str]:
    """Namespaces a mount holds outside the netns dirs now (and pins whose file carries another
    namespace), with why; EveryNamespaceBusy when the walk cannot be whole."""
    try:
        found = held_mounts(netns_dirs, proc, parsed, first_only=True)
    except OSError as err:
        return EveryNamespaceBusy(f"the mounts that may hold its netns cannot all be read now ({err})")
    busy = dict(found.shared)
    for ns, mounts in found.held.items():
        busy[ns] = f"its netns is held by {mounts[0].describe()}; never unmounted by the reaper"
    return busy


def in_use(
    bin_dirs: tuple[str, ...],
    netns_dirs: tuple[str, ...],
    only: Collection[NsKey] | None = None,
    parsed: ParsedMountinfo | None = None,
) -> Mapping[NsKey, str]:
    """Namespaces that must stay now, with why: a process is in them (busy_namespaces, `only` as
    there) or a mount holds them (mount_held); either walk failing keeps every namespace."""
    held = mount_held(netns_dirs, parsed=parsed)
    if isinstance(held, EveryNamespaceBusy):
        return held
    # The mounts first: their walk is the longer, and a process entering is the likelier news.
    busy = busy_namespaces(bin_dirs, only)
    if isinstance(busy, EveryNamespaceBusy):
        return busy
    return {**held, **busy}
