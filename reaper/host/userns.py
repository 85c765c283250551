"""Who made a namespace: the owners of the user namespaces above it, as the kernel tells them.

NS_GET_USERNS opens a namespace's owning user namespace, NS_GET_PARENT a user namespace's parent
(EPERM at the caller's own or above), NS_GET_OWNER_UID its maker's uid (torvalds/linux
include/uapi/linux/nsfs.h, fs/nsfs.c `ns_ioctl`). The chain is walked up to the reader's own
user namespace, left out (its peers'): a uid other than 0 in it means a user without root made
the namespace or one above it (docs/design.md, "Who made a namespace").
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

from msgspec import Struct

NS_GET_USERNS = 0xB701  # _IO(NSIO 0xb7, 0x1)
NS_GET_PARENT = 0xB702  # _IO(NSIO, 0x2)
NS_GET_OWNER_UID = 0xB704  # _IO(NSIO, 0x4), a uid_t written to the argument
MAX_DEPTH = 40  # user namespaces nest 32 deep at most (kernel/user_namespace.c, create_user_ns)
_UID = struct.Struct("=I")


class Owners(Struct, frozen=True):
    """The owner of each user namespace from a namespace's owner up, below the reader's own."""

    uids: tuple[int, ...]

    @property
    def user(self) -> int | None:
        """The uid of a user without root that made the namespace or one above it; None: all uid 0."""
        return next((uid for uid in self.uids if uid != 0), None)


def own_user_namespace() -> tuple[int, int]:
    st = os.stat("/proc/self/ns/user")
    return st.st_dev, st.st_ino


def owner_uid(user_fd: int) -> int:
    """The owner of the user namespace `user_fd` is open on, as a uid of the caller's."""
    buf = bytearray(_UID.size)
    fcntl.ioctl(user_fd, NS_GET_OWNER_UID, buf, True)
    return int(_UID.unpack(buf)[0])


def owners_of(ns_fd: int, home: tuple[int, int] | None = None) -> Owners:
    """The owners of the user namespaces above namespace `ns_fd` (any type but user), up to `home`
    (default: the caller's); none when owned outside it (EPERM: the caller's parents', weighed
    as theirs). OSError when the kernel cannot tell."""
    home = home if home is not None else own_user_namespace()
    try:
        user = fcntl.ioctl(ns_fd, NS_GET_USERNS)
    except OSError as err:
        if err.errno == errno.EPERM:
            return Owners(())
        raise
    uids: list[int] = []
    try:
        for _ in range(MAX_DEPTH):
            st = os.fstat(user)
            if (st.st_dev, st.st_ino) == home:
                return Owners(tuple(uids))
            uids.append(owner_uid(user))
            try:
                parent = fcntl.ioctl(user, NS_GET_PARENT)
            except OSError as err:
                if err.errno == errno.EPERM:
                    return Owners(tuple(uids))  # at the top the caller can see
                raise
            os.close(user)
            user = parent
    finally:
        os.close(user)
    raise OSError(errno.ELOOP, f"user namespaces nested over {MAX_DEPTH} deep")


def mount_namespace_owners(pid: int, mount_ns: int) -> Owners | None:
    """The owners above mount namespace `mount_ns` (inode), through task `pid`; None when `pid` is
    not in it now (gone, moved, reused) or cannot be asked."""
    return owners_at(f"/proc/{pid}/ns/mnt", mount_ns) if pid > 0 else None


def owners_at(path: str, ino: int) -> Owners | None:
    """The owners above the namespace at `path` (`/proc/<pid>/ns/<type>`) if it still is inode
    `ino`; None when not, or when it cannot be opened or asked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return owners_of(fd) if os.fstat(fd).st_ino == ino else None
    except OSError:
        return None
    finally:
        os.close(fd)
