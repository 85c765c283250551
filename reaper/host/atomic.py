"""Replacing a file whole: never half-written, never written through a planted symlink."""

from __future__ import annotations

import contextlib
import os

from reaper.host.confined import open_root


def write_atomically(path: str, data: bytes, mode: int) -> None:
    """A temp file created exclusively beside `path`, given `mode`, fsynced, renamed over `path`,
    both reached through one fd of the directory (not a symlink); a symlink at `path` is
    replaced, not followed. OSError, leaving no temp file."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = open_root(directory)
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"  # not `secrets`: a one-shot would pay for its imports
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        try:
            os.fchmod(fd, mode)  # whatever the umask took away
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    finally:
        os.close(dir_fd)
