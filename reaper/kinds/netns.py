"""Network namespace pins: files under the netns dirs with a namespace bind-mounted on them.

Identity: the pin's path. A pin joins the attachment that owns its namespace (a cache entry
or a sandbox naming it); a pin nothing names stands alone, and is a candidate only when its
name is one a runtime makes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
from collections.abc import Mapping, Sequence

from msgspec import Struct

from reaper.host.confined import fstatfs_type, libc, opened_dir, unlink_beneath
from reaper.host.files import NSFS_MAGIC, PROC_SUPER_MAGIC, DirLister, describe_oserror
from reaper.host.mounts import unpin_hazard
from reaper.host.procs import busy_namespaces
from reaper.kinds import Found, Kind, Look, Pin, ReclaimContext
from reaper.model import CorruptFile, DetailValue, Done, Identity, NetnsTie, NsKey, ResourceRef
from reaper.names import is_runtime_netns_name

MNT_DETACH = 2  # umount2(2) flag: detach now, free once unused


class NetnsPin(Struct, frozen=True, kw_only=True):
    """A file under a netns dir, normally a bind mount of a network namespace."""

    name: str
    path: str
    directory: str
    ns: NsKey
    is_namespace: bool  # False: a stale plain file, no namespace mounted on it
    mtime: float
    runtime_named: bool  # the name is one a container runtime makes


def collect_pins(
    dirs: tuple[str, ...], patterns: Sequence[re.Pattern[str]]
) -> tuple[list[NetnsPin], list[CorruptFile]]:
    pins: list[NetnsPin] = []
    lister = DirLister("netns")
    corrupt = lister.corrupt
    nsfs = _nsfs_device()
    for directory in dirs:
        for dir_fd, entry in lister.scan(directory, directory):
            path = os.path.join(directory, entry.name)
            if entry.is_symlink():
                corrupt.append(CorruptFile("netns", path, "symlink, not followed"))
                continue
            if entry.is_dir(follow_symlinks=False):
                continue
            try:
                st, is_ns = _look_at(dir_fd, entry.name, nsfs)
            except OSError as err:
                corrupt.append(CorruptFile("netns", path, describe_oserror(err)))
                continue
            if not stat.S_ISREG(st.st_mode):
                corrupt.append(CorruptFile("netns", path, "not a regular file"))
                continue
            key = NsKey(st.st_dev, st.st_ino)
            pins.append(
                NetnsPin(
                    name=entry.name,
                    path=path,
                    directory=directory,
                    ns=key,
                    is_namespace=is_ns,
                    mtime=st.st_mtime,
                    runtime_named=is_runtime_netns_name(entry.name, patterns, directory),
                )
            )
    return pins, list(corrupt.records())


def _open_pin(dir_fd: int, name: str) -> int:
    """An O_PATH fd on the pin (on the namespace mounted there, if any), never through a
    symlink and never opening a FIFO or device for reading."""
    return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _nsfs_device() -> int | None:
    """The device every namespace's inode is on (this process's own netns is one of them)."""
    try:
        return os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return None


def _look_at(dir_fd: int, name: str, nsfs: int | None) -> tuple[os.stat_result, bool]:
    """The pin's stat, and whether a namespace is mounted on it: an inode on the device of this
    process's own namespace is one (one filesystem has the device at a time); anything else is
    asked its filesystem's magic (a statfs per pin, which the common case never needs)."""
    fd = _open_pin(dir_fd, name)
    try:
        st = os.fstat(fd)
        if nsfs is not None and st.st_dev == nsfs:
            return st, True
        return st, fstatfs_type(fd) in (NSFS_MAGIC, PROC_SUPER_MAGIC)
    finally:
        os.close(fd)


def find(look: Look) -> Found[NetnsPin]:
    opts = look.options
    pins, corrupt = collect_pins(opts.netns_dirs, opts.netns_patterns)
    return Found(tuple(pins), tuple(corrupt))


def identity(pin: NetnsPin) -> Identity:
    return ("netns", pin.path)


def ref(pin: NetnsPin) -> ResourceRef:
    details: dict[str, DetailValue] = {"path": pin.path}
    if not pin.is_namespace:
        details["stale"] = True
    return ResourceRef(kind="netns", name=pin.name, created_at=pin.mtime, details=details, identity=identity(pin))


def tie(pin: NetnsPin) -> NetnsTie:
    return NetnsTie(pin.ns if pin.is_namespace else None, pin.path, pin.runtime_named)


# ------------------------------------------------------------------------------ reclaiming


def reclaim(pins: Sequence[NetnsPin], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Unmount and unlink every pin at once, so the kernel drops their veths in one batch."""
    hazard = unpin_hazard(ctx.netns_dirs)
    if hazard is not None:
        return {identity(pin): Done.left(hazard) for pin in pins}
    busy = busy_namespaces(ctx.bin_dirs)
    return {identity(pin): _unpin(pin, ctx, busy) for pin in pins}


def _unpin(pin: NetnsPin, ctx: ReclaimContext, busy: Mapping[NsKey, str]) -> Done:
    if pin.directory not in ctx.netns_dirs or os.path.join(pin.directory, pin.name) != pin.path or "/" in pin.name:
        return Done.left("not directly inside a netns dir")
    try:
        with opened_dir(pin.directory, pin.directory) as dir_fd:
            return _unpin_at(dir_fd, pin, ctx, busy)
    except FileNotFoundError:
        return Done.freed()
    except OSError as err:
        return Done.left(describe_oserror(err))


def _unpin_at(dir_fd: int, pin: NetnsPin, ctx: ReclaimContext, busy: Mapping[NsKey, str]) -> Done:
    try:
        fd = _open_pin(dir_fd, pin.name)
    except FileNotFoundError:
        return Done.freed()
    except OSError as err:
        return Done.left("a symlink now; not followed" if err.errno == errno.ELOOP else describe_oserror(err))
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            return Done.left("a symlink now; not followed")
        is_ns = fstatfs_type(fd) in (NSFS_MAGIC, PROC_SUPER_MAGIC)
        if not pin.is_namespace:
            if is_ns:
                return Done.left("a namespace is mounted on it now")
        else:
            if not is_ns:
                return Done.left("no namespace is mounted on it any more")
            key = NsKey(st.st_dev, st.st_ino)
            if key != pin.ns:
                return Done.left("it pins another namespace now")
            if key in ctx.live_netns:
                return Done.left("a live sandbox names this netns")
            if key in busy:
                return Done.left(busy[key])
            # The mount the fd holds, whatever the name points at by now: the fd's magic link
            # names exactly the namespace just checked.
            if libc.umount2(f"/proc/self/fd/{fd}".encode(), MNT_DETACH) != 0:
                code = ctypes.get_errno()
                if code != errno.EINVAL:  # not a mount point: already unmounted
                    return Done.left(f"umount: {os.strerror(code)}")
    finally:
        os.close(fd)
    try:
        unlink_beneath(pin.directory, pin.path, _plain_file)
    except FileNotFoundError:
        pass
    except OSError as err:
        return Done.left(f"unlink: {describe_oserror(err)}")
    return Done.freed()


def _plain_file(now: os.stat_result) -> str | None:
    """What is left once the namespace is unmounted: the pin's own empty file."""
    if not stat.S_ISREG(now.st_mode):
        return "not a regular file now"
    if now.st_size != 0:
        return "holds data: not a pin"
    return None


def as_pin(pin: NetnsPin) -> Pin | None:
    return Pin(pin.ns, pin.path) if pin.is_namespace else None


def proves(pin: NetnsPin, netns: NsKey | None) -> bool:
    """A namespace mounted on the pin proves its attachment; a stale file does not."""
    return pin.is_namespace


KIND: Kind[NetnsPin] = Kind(
    name="netns",
    find=find,
    identity=identity,
    ref=ref,
    tie=tie,
    reclaim=reclaim,
    del_needs=True,
    pin=as_pin,
    proves=proves,
)
