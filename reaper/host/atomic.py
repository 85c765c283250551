"""Replacing a file whole: never half-written, never written through a planted symlink."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomically(path: str, data: bytes, mode: int) -> None:
    """A temp file created exclusively beside `path`, given `mode`, fsynced, renamed over `path`.

    A symlink at `path` is replaced by the rename, not followed. Raises OSError; leaves no temp
    file behind.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
