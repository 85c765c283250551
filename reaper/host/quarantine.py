"""--quarantine-dir: keep a reclaimed lease or cache file (under its original path) for an undo."""

from __future__ import annotations

import errno
import os
import shutil
import time

from reaper.host.files import describe_oserror
from reaper.model import Done


class QuarantineError(OSError):
    pass


class Quarantine:
    def __init__(self, directory: str, now: float | None = None) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
        self.root = os.path.realpath(directory)
        self.base = os.path.join(self.root, stamp)

    def move(self, path: str) -> str:
        """Move `path` to <dir>/<timestamp>/<path>; the new path. Never through a symlink."""
        dest = os.path.join(self.base, path.lstrip("/"))
        parent = os.path.dirname(dest)
        os.makedirs(parent, mode=0o700, exist_ok=True)
        if os.path.realpath(parent) != os.path.normpath(parent) or not parent.startswith(self.root + os.sep):
            raise QuarantineError(f"quarantine path {parent} goes through a symlink")
        if os.path.lexists(dest):
            raise QuarantineError(f"{dest} already exists")
        try:
            os.rename(path, dest)
        except OSError as err:
            if err.errno != errno.EXDEV:  # another filesystem: copy, then remove
                raise
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out)
                out.flush()
                os.fsync(out.fileno())
            os.unlink(path)
        os.chmod(dest, 0o600, follow_symlinks=False)  # cache files carry configs: owner only
        return dest


def remove_or_quarantine(path: str, quarantine: Quarantine | None) -> Done:
    """Unlink `path`, or move it into the quarantine when there is one."""
    try:
        if quarantine is not None:
            return Done.moved(quarantine.move(path))
        os.unlink(path)
    except FileNotFoundError:
        return Done.freed()
    except OSError as err:
        return Done.left(describe_oserror(err))
    return Done.freed()
