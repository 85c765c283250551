"""Careful file reading: no symlinks followed, bounded size, directories listed once."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat

from reaper.model import CorruptFile, NsKey

NSFS_MAGIC = 0x6E736673
PROC_SUPER_MAGIC = 0x9FA0

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class UnfitFile(Exception):
    """The file is too large, or not a regular file, to be read as data."""


def read_file_nofollow(path: str, limit: int, follow: bool = False) -> bytes:
    """The bytes of a regular file, refusing symlinks (unless `follow`) and anything over `limit`."""
    return read_file_with_stat(path, limit, follow)[0]


def read_file_with_stat(path: str, limit: int, follow: bool = False) -> tuple[bytes, os.stat_result]:
    """Like read_file_nofollow, with the file's stat taken from the same open file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnfitFile("not a regular file")
        if st.st_size > limit:
            raise UnfitFile(f"{st.st_size} bytes, over the {limit}-byte limit")
        # Read what fstat promises plus one byte (a 4 MiB buffer per call would cost more than
        # the read), then on until EOF in case the file grew.
        chunks = [os.read(fd, min(st.st_size, limit) + 1)]
        size = len(chunks[0])
        while chunks[-1] and size <= limit:
            chunks.append(os.read(fd, 65536))
            size += len(chunks[-1])
        if size > limit:
            raise UnfitFile(f"over the {limit}-byte limit")
        data = b"".join(chunks)
        return data, st
    finally:
        os.close(fd)


def fs_type(path: str) -> int:
    """statfs(2) f_type of the filesystem holding `path` (follows the final mount, not symlinks)."""
    buf = ctypes.create_string_buffer(256)
    if _libc.statfs(os.fsencode(path), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    # f_type is the first member, a native long, on every Linux ABI we run on.
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def describe_oserror(err: OSError) -> str:
    return err.strerror or str(err)


def namespace_of(path: str | None) -> NsKey | None:
    """The (dev, ino) a netns path names now, or None when it is empty, relative or gone."""
    if not path or not path.startswith("/"):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return NsKey(st.st_dev, st.st_ino)


def namespace_uninspectable(path: str | None) -> bool:
    """A netns path that exists (or is a process's) but cannot be stat'ed: nobody can tell
    whether it is in use, so nothing that names it may be called an orphan."""
    if not path:
        return False
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return path.startswith("/proc/") and os.path.isdir(path.split("/ns/")[0])
    except OSError:
        return True
    return False


class DirLister:
    """Lists directories, each once (by device and inode: /var/run/netns and /run/netns are
    usually one). A missing directory is empty; one that cannot be read becomes a corrupt record
    of `kind`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.corrupt: list[CorruptFile] = []
        self._seen: set[tuple[int, int]] = set()

    def entries(self, directory: str) -> list[os.DirEntry[str]]:
        try:
            st = os.stat(directory)
            if (st.st_dev, st.st_ino) in self._seen:
                return []
            self._seen.add((st.st_dev, st.st_ino))
            return list(os.scandir(directory))
        except FileNotFoundError:
            return []
        except OSError as err:
            self.corrupt.append(CorruptFile(self.kind, directory, describe_oserror(err)))
            return []
