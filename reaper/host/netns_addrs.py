"""The addresses configured in other network namespaces, each read from inside it.

One thread of its own setns(2)s into each namespace in turn and dumps its addresses there; no
other code runs on that thread. The fd opened must be the namespace the caller found; one a
user without root made is never joined. Bounded by one deadline and a byte and message bound
per dump. No CNI knowledge here. Why: docs/design.md, "Reading addresses in other namespaces".
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Sequence

from msgspec import Struct

from reaper.host.confined import libc, open_path_in_root
from reaper.host.files import describe_oserror
from reaper.host.netlink import ADDRESS_SIZE, DumpLimits, Netlink, attrs, dump_kept
from reaper.host.userns import owners_of
from reaper.model import NsKey

CLONE_NEWNET = 0x40000000
RTM_GETADDR = 22
IFA_ADDRESS = 1
IFA_LOCAL = 2
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, ifindex
_HEADER = 16  # nlmsghdr
_ADDR_WANTED = frozenset({IFA_ADDRESS, IFA_LOCAL})
_ALL_FAMILIES = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
READ_TIMEOUT = 5.0  # seconds the kernel gets to answer one namespace's dump
# One namespace's dump, past which it is that namespace's error: a node's own netns may hold
# many (kube-proxy's IPVS mode puts every Service address on kube-ipvs0), a pod's a handful.
MAX_ADDRESS_MESSAGES = 200_000
MAX_ADDRESS_BYTES = 32 * 1024 * 1024


class Handle(Struct, frozen=True):
    """A path the namespace was found at: a pin, or `/proc/<pid>/ns/net`."""

    path: str
    pinned: bool  # a file under a netns dir, opened without following a symlink
    # A holder's root (`/proc/<pid>/root`) that `path`, a mount point as the holder sees it, is
    # walked beneath with no symlink followed: a planted link could lead where the mount walk
    # never judged the filesystems (a FUSE that never answers).
    beneath: str | None = None


class NamespaceToRead(Struct, frozen=True):
    """A namespace to read, and the ways to reach it (tried in order until one opens it)."""

    ns: NsKey  # what the caller found there: the fd opened must be this namespace
    where: str  # in words, for a reason: "the netns pinned at /run/netns/x", "the netns of pid 42"
    handles: tuple[Handle, ...]  # none: the namespace the reader starts in
    # Found only through mounts in mount namespaces a user without root made (that uid).
    mounted_by_user: int | None = None
    # Its handles are every process /proc showed in it, no pin or mount holds it: once each
    # has exited, it is read as empty.
    only_processes: bool = False


class NamespaceAddresses(Struct, frozen=True):
    """What reading one namespace gave: its addresses (as inet_ntop prints them), or why not."""

    ns: NsKey
    where: str
    addresses: tuple[str, ...]
    error: str | None = None
    made_by_user: int | None = None  # a user without root made it (this uid): it was not read
    mounted_by_user: int | None = None  # as the NamespaceToRead said


def _setns_ctypes(fd: int, nstype: int) -> None:
    if libc.setns(fd, nstype) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


# os.setns arrived in Python 3.12; before that, libc's.
_setns: Callable[[int, int], None] = getattr(os, "setns", _setns_ctypes)


def this_threads_netns() -> NsKey:
    st = os.stat("/proc/thread-self/ns/net")
    return NsKey(st.st_dev, st.st_ino)


def parse_address(
    data: bytes | bytearray, offset: int, length: int, wanted: frozenset[bytes] | None = None
) -> str | None:
    """One RTM_NEWADDR message's address: IFA_LOCAL when there is one (IFA_ADDRESS is then a
    point-to-point peer's), else IFA_ADDRESS; with `wanted` (packed addresses), None for others."""
    if length < _HEADER + _IFADDRMSG.size:
        return None
    family = data[offset + _HEADER]
    size = ADDRESS_SIZE.get(family)
    if size is None:
        return None
    at = attrs(data, offset + _HEADER + _IFADDRMSG.size, offset + length, _ADDR_WANTED)
    span = at.get(IFA_LOCAL) or at.get(IFA_ADDRESS)
    if span is None or span[1] - span[0] != size:
        return None
    raw = bytes(data[span[0] : span[1]])
    if wanted is not None and raw not in wanted:
        return None
    return socket.inet_ntop(family, raw)


def _dump_addresses(limits: DumpLimits, wanted: frozenset[bytes] | None) -> tuple[str, ...]:
    """The `wanted` (else all) addresses of the calling thread's netns, on a socket there; OSError past `limits`."""
    left = READ_TIMEOUT if limits.deadline is None else limits.deadline - limits.clock()
    with Netlink(timeout=max(0.001, min(left, READ_TIMEOUT))) as nl:
        found = dump_kept(
            nl, RTM_GETADDR, _ALL_FAMILIES, lambda data, off, length: parse_address(data, off, length, wanted), limits
        )
        return tuple(sorted(set(found)))


def _open_checked(handle: Handle, ns: NsKey) -> int:
    """An fd setns can take on namespace `ns`, opened by `handle`, or OSError."""
    if handle.pinned:
        # Reopened through an O_PATH fd only once it is a regular file (as a namespace shows).
        path_fd = _open_path(handle)
        try:
            if not stat.S_ISREG(os.fstat(path_fd).st_mode):
                raise OSError(errno.ESTALE, "not a namespace pin now")
            fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        finally:
            os.close(path_fd)
    else:
        fd = os.open(handle.path, os.O_RDONLY | os.O_CLOEXEC)
    st = os.fstat(fd)
    if NsKey(st.st_dev, st.st_ino) != ns:
        os.close(fd)
        raise OSError(errno.ESTALE, "another namespace is there now")
    return fd


def _open_path(handle: Handle) -> int:
    """An O_PATH fd on the handle's file, no symlink followed (beneath a holder's root, none at all)."""
    if handle.beneath is None:
        return os.open(handle.path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return open_path_in_root(handle.beneath, handle.path)
    except PermissionError as err:
        if err.filename != handle.beneath:
            raise
        # The kernel's ptrace access check on the holder (proc_fd_access_allowed): a protected
        # init's threads, whose ns/mnt the mount walk could not look at either.
        raise OSError(err.errno, f"{err.strerror}: {handle.beneath}, a task the reaper may not look at") from None


class EveryProcessLeft(OSError):
    """Each process a namespace was found through has exited, and nothing else was seen to hold it."""


def _open_target(target: NamespaceToRead) -> int:
    """An fd on the target's namespace by the first handle that opens it; OSError when none
    does, EveryProcessLeft when the target is `only_processes` and each of them is gone."""
    failed: list[OSError] = []
    for handle in target.handles:
        try:
            return _open_checked(handle, target.ns)
        except OSError as err:
            failed.append(err)
    assert failed
    processes = all(not h.pinned and h.path.startswith("/proc/") for h in target.handles)
    if target.only_processes and processes and all(err.errno in (errno.ENOENT, errno.ESRCH) for err in failed):
        raise EveryProcessLeft(errno.ENOENT, "every process it was found through has exited")
    raise failed[-1]


def _read_one(
    target: NamespaceToRead, home: int, limits: DumpLimits, wanted: frozenset[bytes] | None
) -> NamespaceAddresses:
    """The target read from inside it; a namespace a user without root made is not joined."""
    if not target.handles:
        st = os.fstat(home)
        if NsKey(st.st_dev, st.st_ino) != target.ns:
            raise OSError(errno.ESTALE, "the reader did not start in it")
        _setns(home, CLONE_NEWNET)
    else:
        try:
            fd = _open_target(target)
        except EveryProcessLeft:  # or held now only by what no walk sees (an open fd)
            return _result(target)
        try:
            user = owners_of(fd).user
            if user is not None:
                return _result(target, made_by_user=user)
            _setns(fd, CLONE_NEWNET)
        finally:
            os.close(fd)
    return _result(target, _dump_addresses(limits, wanted))


def _result(
    target: NamespaceToRead, addresses: tuple[str, ...] = (), error: str | None = None, made_by_user: int | None = None
) -> NamespaceAddresses:
    return NamespaceAddresses(target.ns, target.where, addresses, error, made_by_user, target.mounted_by_user)


def read_addresses(
    targets: Sequence[NamespaceToRead],
    *,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    wanted: frozenset[bytes] | None = None,
    max_messages: int | None = None,
    max_bytes: int | None = None,
) -> list[NamespaceAddresses]:
    """Each target's addresses, in order, read one at a time on one thread of its own until
    `deadline` (on `clock`); a target not read whole by then, or whose dump is over the bounds
    (MAX_ADDRESS_MESSAGES and MAX_ADDRESS_BYTES at the call by default), has an error instead.
    With `wanted` (packed addresses), only those are kept."""
    limits = DumpLimits(
        max_bytes=MAX_ADDRESS_BYTES if max_bytes is None else max_bytes,
        max_items=MAX_ADDRESS_MESSAGES if max_messages is None else max_messages,
        deadline=deadline,
        clock=clock,
    )
    results: dict[int, NamespaceAddresses] = {}
    lock = threading.Lock()
    stop = threading.Event()
    finished = threading.Event()

    def work() -> None:
        try:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            with lock:
                for i, t in enumerate(targets):
                    results[i] = _result(t, error=f"no fd on the reader's netns: {describe_oserror(err)}")
            finished.set()
            return
        try:
            for i, target in enumerate(targets):
                if stop.is_set() or deadline - clock() <= 0:
                    break
                try:
                    done = _read_one(target, home, limits, wanted)
                except OSError as err:
                    done = _result(target, error=describe_oserror(err))
                except Exception as err:  # an answer that does not decode: this namespace's error
                    done = _result(target, error=f"{type(err).__name__}: {err}")
                with lock:
                    results[i] = done
        finally:
            with contextlib.suppress(OSError):
                _setns(home, CLONE_NEWNET)  # back where it started, though it ends next
            os.close(home)
            finished.set()

    reader = threading.Thread(target=work, name="netns-addresses", daemon=True)
    reader.start()
    finished.wait(max(0.0, deadline - clock()))
    stop.set()
    with lock:
        got = dict(results)
    return [got.get(i) or _result(t, error="not read by the deadline") for i, t in enumerate(targets)]
