"""Reaching files beneath a root directory without following any symlink on the way.

Every root is opened once with `O_NOFOLLOW` (one whose last component is a symlink is refused:
name the real directory), and all beneath it reached from that fd by `openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS)`, or one `O_NOFOLLOW | O_DIRECTORY` open a step where the kernel lacks it:
whoever can write beneath a root can make the reaper read or delete only what is beneath it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable, Iterator

# The libc already loaded: no search for it (`ldconfig -p` at every start of a one-shot).
libc = ctypes.CDLL(None, use_errno=True)

SYS_OPENAT2 = 437  # the same number on every architecture (added with the generic table, 5.6)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
NO_SYMLINKS = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


class RootRefused(OSError):
    """A root that is a symlink, or not a directory: not used."""


class Escapes(OSError):
    """A path that is not beneath the root it was given with."""


class Changed(OSError):
    """The file is not the one that was judged any more."""


def open_root(root: str) -> int:
    """The root directory's fd; RootRefused when it is a symlink or no directory."""
    try:
        return os.open(root, _DIR_FLAGS | os.O_NOFOLLOW)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(root):
            target = os.readlink(root)
            raise RootRefused(errno.ELOOP, f"is a symlink (to {target}); name the real directory", root) from None
        if err.errno == errno.ENOTDIR:
            raise RootRefused(errno.ENOTDIR, "not a directory", root) from None
        raise


def parts_beneath(root: str, path: str) -> tuple[str, ...]:
    """The components of `path` below `root` (none for the root itself); Escapes when it is not
    beneath it or holds `.`, `..` or empty components."""
    base = root.rstrip("/") or "/"
    if path in (base, root):
        return ()
    prefix = base if base.endswith("/") else base + "/"
    if not path.startswith(prefix):
        raise Escapes(errno.EXDEV, f"not beneath {root}", path)
    parts = tuple(path[len(prefix) :].split("/"))
    if any(p in ("", ".", "..") for p in parts):
        raise Escapes(errno.EXDEV, f"not a plain path beneath {root}", path)
    return parts


def openat2(dir_fd: int, rel: str, flags: int, mode: int, resolve: int) -> int | None:
    """openat2(2), or None when this kernel (or a seccomp filter) does not offer it."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    # syscall(2) is variadic: every argument a full register wide.
    fd = libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_long(dir_fd),
        ctypes.c_char_p(os.fsencode(rel)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd >= 0:
        return int(fd)
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EPERM, errno.E2BIG):
        return None
    if code == errno.EXDEV:
        raise Escapes(code, "leads outside its root", rel)
    raise OSError(code, os.strerror(code), rel)


def _open_dir_at(dir_fd: int, name: str) -> int:
    """A directory directly in `dir_fd`; ELOOP when it is a symlink (O_DIRECTORY says ENOTDIR)."""
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
    except NotADirectoryError:
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def _open_dirs(dir_fd: int, parts: tuple[str, ...], *, create: bool = False) -> int:
    """The directory `parts` below `dir_fd`, one O_NOFOLLOW open a step; `create` makes missing ones (0700)."""
    fd = dir_fd
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            step = _open_dir_at(fd, part)
            if fd != dir_fd:
                os.close(fd)
            fd = step
    except BaseException:
        if fd != dir_fd:
            os.close(fd)
        raise
    return fd


def open_beneath(dir_fd: int, parts: tuple[str, ...], flags: int, mode: int = 0o600, *, walk_only: bool = False) -> int:
    """Open `parts` relative to `dir_fd`; a symlink anywhere on the way is ELOOP, a way out
    is Escapes. `walk_only` skips openat2 (what kernels before 5.6 get; for tests)."""
    if not parts or any(p in ("", ".", "..") or "/" in p for p in parts):
        raise Escapes(errno.EXDEV, "not a plain path", "/".join(parts))
    if not walk_only:
        fd = openat2(dir_fd, "/".join(parts), flags, mode, NO_SYMLINKS)
        if fd is not None:
            return fd
    fd = _open_dirs(dir_fd, parts[:-1])  # what openat2 does, one O_NOFOLLOW open a step
    try:
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        if fd != dir_fd:
            os.close(fd)


def open_path_in_root(root: str, path: str) -> int:
    """An O_PATH fd on `path` as the process whose root is `root` (`/proc/<pid>/root`) sees it,
    walked beneath that root with no symlink followed."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return open_beneath(root_fd, parts_beneath("/", path), os.O_PATH)
    finally:
        os.close(root_fd)


@contextlib.contextmanager
def opened_dir(root: str, directory: str, *, create: bool = False, walk_only: bool = False) -> Iterator[int]:
    """`directory` (the root or beneath it) as an fd, no symlink followed; `create` makes missing dirs (0700)."""
    root_fd = open_root(root)
    try:
        parts = parts_beneath(root, directory)
        if not parts:
            yield root_fd
            return
        if create:
            fd = _open_dirs(root_fd, parts, create=True)
        else:
            fd = open_beneath(root_fd, parts, _DIR_FLAGS, walk_only=walk_only)
        try:
            yield fd
        finally:
            os.close(fd)
    finally:
        os.close(root_fd)


class UnfitFile(Exception):
    """The file is too large, or no regular file, to be read as data."""


def read_fd(fd: int, limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file open on `fd`; UnfitFile when not regular or over `limit` bytes."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnfitFile("not a regular file")
    if st.st_size > limit:
        raise UnfitFile(f"{st.st_size} bytes, over the {limit}-byte limit")
    # What fstat promises plus one byte (not a buffer of `limit`), then on in case it grew.
    first = os.read(fd, min(st.st_size, limit) + 1)
    chunks = [first]
    size = len(first)
    while chunks[-1] and size <= limit:
        chunks.append(os.read(fd, 65536))
        size += len(chunks[-1])
    if size > limit:
        raise UnfitFile(f"over the {limit}-byte limit")
    return (first if size == len(first) else b"".join(chunks)), st


def read_at(dir_fd: int, name: str, limit: int) -> tuple[bytes, os.stat_result]:
    """A regular file directly in `dir_fd`, never through a symlink or blocking on a FIFO."""
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def read_admins(path: str, limit: int) -> bytes:
    """A regular file the node's admin or the kubelet owns (a runtime config, a token): links
    followed, as their readers do, but never blocking on a FIFO or read past `limit`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return read_fd(fd, limit)[0]
    finally:
        os.close(fd)


def read_beneath(root: str, path: str, limit: int) -> tuple[bytes, os.stat_result]:
    """Like read_at, for a file `path` beneath `root`."""
    with opened_dir(root, os.path.dirname(path)) as dir_fd:
        return read_at(dir_fd, os.path.basename(path), limit)


def same_file(st: os.stat_result) -> Callable[[os.stat_result], str | None]:
    """A check for unlink_beneath: still the file `st` describes, unchanged (an inode number
    alone is reused at once by a file made in its place)."""

    def check(now: os.stat_result) -> str | None:
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or now.st_ctime_ns != st.st_ctime_ns:
            return "replaced or changed since it was read"
        if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            return "changed since it was read"
        return None

    return check


def unlink_beneath(root: str, path: str, check: Callable[[os.stat_result], str | None]) -> None:
    """unlinkat(2) of `path` beneath `root`, right after fstatat(2) shows `check` it is still the
    file judged (Changed otherwise); FileNotFoundError when gone."""
    with opened_dir(root, os.path.dirname(path)) as dir_fd:
        name = os.path.basename(path)
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(now.st_mode):
            raise Changed(errno.EISDIR, "a directory now", path)
        problem = check(now)
        if problem is not None:
            raise Changed(errno.ESTALE, problem, path)
        os.unlink(name, dir_fd=dir_fd)


def fstatfs_type(fd: int) -> int:
    """fstatfs(2) f_type of the filesystem the open fd is on."""
    buf = ctypes.create_string_buffer(256)
    if libc.fstatfs(fd, buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    # f_type is the first member, a native long, on every Linux ABI we run on.
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
