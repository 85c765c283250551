"""Looking up a netns path a file names, only where a network namespace can be.

A stat(2) of an arbitrary path can wait for good (a FUSE server that never answers), so a path
is looked at only as a pin directly in a given netns dir on a local filesystem (one statx,
AT_STATX_DONT_SYNC, no symlink followed) or as `/proc/<pid>/ns/net`; any other is refused with
why. Why, and where each runtime pins: docs/design.md, "Netns paths a file names".
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import struct
from collections.abc import Sequence
from types import TracebackType
from typing import NamedTuple, Self

from reaper.host.confined import fstatfs_type, libc, open_root
from reaper.host.files import PROC_SUPER_MAGIC
from reaper.host.pins import nsfs_device
from reaper.model import NsKey

PATH_MAX = 4096
NAME_MAX = 255
PROC = "/proc"
_PROC_NS_NET = re.compile(r"/proc/([1-9][0-9]{0,9})/ns/net")

# statfs f_type of the filesystems a netns dir may be on (include/uapi/linux/magic.h): never
# FUSE (whose server may never answer) or a network filesystem.
LOCAL_FILESYSTEMS = {
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xF2F52010: "f2fs",
    0x2FC12FC1: "zfs",
    0x794C7630: "overlay",
}

AT_SYMLINK_NOFOLLOW = 0x100
AT_NO_AUTOMOUNT = 0x800
AT_EMPTY_PATH = 0x1000
AT_STATX_DONT_SYNC = 0x4000
STATX_TYPE = 0x1
STATX_INO = 0x100


# stx_mode, stx_ino, stx_dev_major, stx_dev_minor of the 256-byte struct statx
# (include/uapi/linux/stat.h), at offsets 28, 32, 136 and 140.
_STATX = struct.Struct("=28xH2xQ96xII")
_STATX_SIZE = 256


class Cached(NamedTuple):
    """What statx says from the kernel's caches alone: type, device, inode."""

    mode: int
    dev: int
    ino: int


def cached_stat(dir_fd: int, name: str, *, follow: bool) -> Cached:
    """statx(2) of `name` in `dir_fd` ("" for the fd itself) with AT_STATX_DONT_SYNC: a FUSE or
    network filesystem answers from its cache, never asking its server."""
    statx = getattr(libc, "statx", None)  # glibc 2.28 and later
    if statx is None:
        raise OSError(errno.ENOSYS, "statx is not in this libc", name)
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    flags = AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC | (0 if follow else AT_SYMLINK_NOFOLLOW)
    if not name:
        flags |= AT_EMPTY_PATH
    if statx(dir_fd, os.fsencode(name), flags, STATX_TYPE | STATX_INO, buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), name)
    mode, ino, major, minor = _STATX.unpack_from(buf)
    return Cached(mode, os.makedev(major, minor), ino)


class NetnsLookup(NamedTuple):
    key: NsKey | None  # what the path names now; None when empty, gone or not looked at
    uninspectable: bool = False  # it exists (or is a live process's) but cannot be inspected
    refused: str | None = None  # why it was not looked at: not where a netns can be


GONE = NetnsLookup(None)


class _Dir(NamedTuple):
    fd: int
    dev: int


def _aliases(directory: str, var_run_is_run: bool) -> set[str]:
    """The spellings of a netns dir a runtime may write: as given, as resolved, and with
    `/var/run` for `/run` (and back) when the one is a link to the other here."""
    given = os.path.normpath(directory)
    names = {given, os.path.realpath(given)}
    if var_run_is_run:
        for name in list(names):
            if name.startswith("/run/"):
                names.add("/var" + name)
            elif name.startswith("/var/run/"):
                names.add(name[4:])
    return names


class NetnsPlaces:
    """Looks up netns paths files name, only in `netns_dirs` and `/proc/<pid>/ns/net`; opens each dir once."""

    def __init__(self, netns_dirs: Sequence[str], proc: str = PROC) -> None:
        self.netns_dirs = tuple(dict.fromkeys(netns_dirs))
        self.proc = proc
        var_run_is_run = os.path.realpath("/var/run") == "/run"
        self._dir_of: dict[str, str] = {}
        for directory in self.netns_dirs:
            for alias in _aliases(directory, var_run_is_run):
                self._dir_of.setdefault(alias, directory)
        # dir -> (its fd, its device), or what every path below it is
        self._opened: dict[str, _Dir | NetnsLookup] = {}
        self._nsfs: int | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for opened in self._opened.values():
            if isinstance(opened, _Dir):
                os.close(opened.fd)
        self._opened.clear()

    def look(self, path: str | None) -> NetnsLookup:
        if not path:
            return GONE
        refused = _not_plain(path)
        if refused is not None:
            return NetnsLookup(None, refused=refused)
        match = _PROC_NS_NET.fullmatch(path) if path.startswith("/proc/") else None
        if match is not None:
            return self._look_proc(match.group(1))
        parent, _, name = path.rpartition("/")
        directory = self._dir_of.get(parent or "/")
        if directory is None:
            shown = ", ".join(self.netns_dirs) or "none given"
            return NetnsLookup(None, refused=f"not looked at: neither in a netns dir ({shown}) nor /proc/<pid>/ns/net")
        return self._look_pin(directory, name)

    def _opened_dir(self, directory: str, magic: int, what: str) -> _Dir | NetnsLookup:
        if directory not in self._opened:
            self._opened[directory] = _open_dir(directory, magic, what)
        return self._opened[directory]

    def _nsfs_device(self) -> int | None:
        if self._nsfs is None:
            self._nsfs = nsfs_device()
        return self._nsfs

    def _look_pin(self, directory: str, name: str) -> NetnsLookup:
        opened = self._opened_dir(directory, 0, "no local filesystem")
        if isinstance(opened, NetnsLookup):
            return opened
        dir_fd, home = opened
        try:
            st = cached_stat(dir_fd, name, follow=False)
        except (FileNotFoundError, NotADirectoryError):
            return GONE
        except OSError:
            return NetnsLookup(None, uninspectable=True)
        if stat.S_ISLNK(st.mode):
            return NetnsLookup(None, refused="not looked at: a symlink in the netns dir, not followed")
        if st.dev != home and st.dev != self._nsfs_device():
            return NetnsLookup(None, refused="not looked at: another filesystem is mounted there, not a namespace")
        return NetnsLookup(NsKey(st.dev, st.ino))

    def _look_proc(self, pid: str) -> NetnsLookup:
        opened = self._opened_dir(self.proc, PROC_SUPER_MAGIC, "no procfs")
        if isinstance(opened, NetnsLookup):
            return opened
        proc_fd, proc_dev = opened
        try:
            pid_fd = os.open(pid, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=proc_fd)
        except (FileNotFoundError, NotADirectoryError):
            return GONE  # no such process
        except OSError:
            return NetnsLookup(None, uninspectable=True)
        try:
            if cached_stat(pid_fd, "", follow=False).dev != proc_dev:
                return NetnsLookup(None, refused=f"not looked at: {self.proc}/{pid} is not on {self.proc}")
            st = cached_stat(pid_fd, "ns/net", follow=True)
        except OSError:
            # A kernel thread, a zombie, a protected process: nobody can tell whether it is in use.
            return NetnsLookup(None, uninspectable=True)
        finally:
            os.close(pid_fd)
        if st.dev != self._nsfs_device():
            return NetnsLookup(None, refused="not looked at: not a namespace")
        return NetnsLookup(NsKey(st.dev, st.ino))


def _open_dir(directory: str, magic: int, what: str) -> _Dir | NetnsLookup:
    """`directory` as an fd and its device, when its filesystem is `magic` (0: a local one);
    else what every path below it is."""
    try:
        fd = open_root(directory)
    except (FileNotFoundError, NotADirectoryError):
        return GONE
    except OSError as err:
        return NetnsLookup(None, refused=f"not looked at: {directory}: {err.strerror or err}")
    try:
        f_type = fstatfs_type(fd)
        dev = cached_stat(fd, "", follow=False).dev
    except OSError as err:
        os.close(fd)
        return NetnsLookup(None, refused=f"not looked at: {directory}: {err.strerror or err}")
    if (f_type == magic) if magic else (f_type in LOCAL_FILESYSTEMS):
        return _Dir(fd, dev)
    os.close(fd)
    return NetnsLookup(None, refused=f"not looked at: {directory} is on {what}, f_type {f_type:#x}")


_NOT_NORMAL = frozenset(("", ".", ".."))  # the parts os.path.normpath drops or folds


def _not_plain(path: str) -> str | None:
    """Why `path` is no plain absolute path the kernel could take, or None."""
    ascii_only = path.isascii()  # then one byte a character, as os.fsencode gives it
    try:
        size = len(path) if ascii_only else len(os.fsencode(path))
    except UnicodeEncodeError:
        return "not looked at: not a path (an unencodable character)"
    if "\0" in path:
        return "not looked at: not a path (a NUL)"
    if size >= PATH_MAX:
        return f"not looked at: {size} bytes, longer than any path"
    # What os.path.normpath leaves as it is (tests/unit/host/test_netns_paths.py holds the two alike).
    if (
        not path.startswith("/")
        or path.startswith("//")
        or (path != "/" and not _NOT_NORMAL.isdisjoint(path[1:].split("/")))
    ):
        return "not looked at: not a plain absolute path"
    name = path.rpartition("/")[2]
    if (len(name) if ascii_only else len(os.fsencode(name))) > NAME_MAX:
        return "not looked at: a name longer than any file's"
    return None


def shown(path: str, width: int = 120) -> str:
    """`path` for a one-line reason: quoted, escapes for what does not print, cut to `width`."""
    text = repr(path)
    return text if len(text) <= width else text[: width - 3] + "..."
