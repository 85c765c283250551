"""Namespace pins: files with a namespace bind-mounted on them, of any namespace type: listed
without following a symlink, told from a stale file by the opened fd, and reclaimed through that
fd (unmount exactly the namespace just checked, then unlink the empty file left behind).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable, Iterator

from msgspec import Struct

from reaper.host.confined import fstatfs_type, libc, opened_dir, unlink_beneath
from reaper.host.files import NSFS_MAGIC, PROC_SUPER_MAGIC, DirLister, describe_oserror
from reaper.model import CorruptFile, Done, NsKey

MNT_DETACH = 2  # umount2(2) flag: detach now, free once unused


class Listed(Struct, frozen=True, kw_only=True):
    """A file in a pin directory, as its opened fd showed it."""

    name: str
    path: str
    ns: NsKey
    is_namespace: bool  # False: a stale plain file, no namespace mounted on it
    mtime: float


def list_pins(lister: DirLister, directory: str) -> Iterator[Listed]:
    """Every regular file directly in `directory`; symlinks and other non-regular files become
    corrupt records, subdirectories are skipped."""
    kind, corrupt = lister.kind, lister.corrupt
    nsfs = nsfs_device()
    for dir_fd, entry in lister.scan(directory, directory):
        path = os.path.join(directory, entry.name)
        if entry.is_symlink():
            corrupt.append(CorruptFile(kind, path, "symlink, not followed"))
            continue
        if entry.is_dir(follow_symlinks=False):
            continue
        try:
            st, is_ns = look_at(dir_fd, entry.name, nsfs)
        except OSError as err:
            corrupt.append(CorruptFile(kind, path, describe_oserror(err)))
            continue
        if not stat.S_ISREG(st.st_mode):
            corrupt.append(CorruptFile(kind, path, "not a regular file"))
            continue
        yield Listed(name=entry.name, path=path, ns=NsKey(st.st_dev, st.st_ino), is_namespace=is_ns, mtime=st.st_mtime)


def open_pin(dir_fd: int, name: str) -> int:
    """An O_PATH fd on the pin (its namespace, if mounted), never through a symlink nor opening
    a FIFO or device for reading."""
    return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def nsfs_device() -> int | None:
    """The device every namespace's inode is on (this process's own netns is one of them)."""
    try:
        return os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return None


def is_namespace_fd(fd: int) -> bool:
    """Whether the open fd is on a namespace (nsfs, or proc on kernels before nsfs)."""
    return fstatfs_type(fd) in (NSFS_MAGIC, PROC_SUPER_MAGIC)


def look_at(dir_fd: int, name: str, nsfs: int | None) -> tuple[os.stat_result, bool]:
    """The pin's stat (no symlink followed) and whether a namespace is mounted on it: on this
    process's netns' device, one is; else its O_PATH fd is asked (statfs magic, and fstat)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if nsfs is not None and st.st_dev == nsfs:
        return st, True
    fd = open_pin(dir_fd, name)
    try:
        return os.fstat(fd), is_namespace_fd(fd)
    finally:
        os.close(fd)


# The kind's own say on the namespace now mounted on a pin: why it must stay, or None.
Judge = Callable[[NsKey], str | None]


def unpin(directory: str, name: str, *, was_namespace: bool, ns: NsKey, judge: Judge) -> Done:
    """Unmount pin `name` directly in `directory` (no symlink followed) and unlink its file, if it
    still is what was found: namespace `ns` (which `judge` lets go), or a stale pin's empty file."""
    try:
        with opened_dir(directory, directory) as dir_fd:
            return _unpin_at(dir_fd, directory, name, was_namespace, ns, judge)
    except FileNotFoundError:
        return Done.freed()
    except OSError as err:
        return Done.left(describe_oserror(err))


def _unpin_at(dir_fd: int, directory: str, name: str, was_namespace: bool, ns: NsKey, judge: Judge) -> Done:
    try:
        fd = open_pin(dir_fd, name)
    except FileNotFoundError:
        return Done.freed()
    except OSError as err:
        return Done.left("a symlink now; not followed" if err.errno == errno.ELOOP else describe_oserror(err))
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            return Done.left("a symlink now; not followed")
        is_ns = is_namespace_fd(fd)
        if is_ns != was_namespace:
            return Done.left("a namespace is mounted on it now" if is_ns else "no namespace is mounted on it any more")
        if was_namespace:
            key = NsKey(st.st_dev, st.st_ino)
            if key != ns:
                return Done.left("it pins another namespace now")
            why = judge(key)
            if why is not None:
                return Done.left(why)
            # The fd's magic link names exactly the namespace just checked, whatever the name is now.
            if libc.umount2(f"/proc/self/fd/{fd}".encode(), MNT_DETACH) != 0:
                code = ctypes.get_errno()
                if code != errno.EINVAL:  # not a mount point: already unmounted
                    return Done.left(f"umount: {os.strerror(code)}")
    finally:
        os.close(fd)
    try:
        unlink_beneath(directory, os.path.join(directory, name), _plain_file)
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
