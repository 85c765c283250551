"""Careful file reading for inventory: no symlinks followed, bounded size."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat

NSFS_MAGIC = 0x6E736673
PROC_SUPER_MAGIC = 0x9FA0

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class UnfitFile(Exception):
    """The file is too large, or not a regular file, to be read as data."""


def read_file_nofollow(path: str, limit: int, follow: bool = False) -> bytes:
    """The bytes of a regular file, refusing symlinks (unless `follow`) and anything over `limit`."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnfitFile("not a regular file")
        if st.st_size > limit:
            raise UnfitFile(f"{st.st_size} bytes, over the {limit}-byte limit")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise UnfitFile(f"over the {limit}-byte limit")
        return data
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
