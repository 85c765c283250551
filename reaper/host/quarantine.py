"""--quarantine-dir: keep a reclaimed lease or cache file (under its original path) for an undo.

Both ends are reached beneath their roots (reaper.host.confined): the file by an fd opened
without following a symlink, checked to be the regular file that was judged; the quarantine
path made one directory at a time. Across mounts (each hostPath of the chart is its own mount)
the move is a copy from that fd, bounded and fsynced, then an unlinkat of the same inode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterator

from reaper.host.confined import Changed, opened_dir, same_file, unlink_beneath
from reaper.host.files import describe_oserror
from reaper.model import Done

MAX_QUARANTINE_BYTES = 16 << 20  # larger than any lease or cache file the reaper reads
_COPY_CHUNK = 1 << 16


class QuarantineError(OSError):
    pass


class Quarantine:
    def __init__(self, directory: str, now: float | None = None) -> None:
        self.root = os.path.abspath(directory)
        self.stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))

    def destination(self, path: str) -> str:
        return os.path.join(self.root, self.stamp, path.lstrip("/"))

    def move(self, root: str, path: str, judged: os.stat_result) -> str:
        """Move `path` (beneath `root`, still the inode `judged`) to <dir>/<time>/<path>."""
        dest = self.destination(path)
        with opened_dir(root, os.path.dirname(path)) as src_dir:
            name = os.path.basename(path)
            src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_dir)
            try:
                st = os.fstat(src)
                if not stat.S_ISREG(st.st_mode):
                    raise QuarantineError(errno.EINVAL, "not a regular file", path)
                problem = same_file(judged)(st)
                if problem is not None:
                    raise Changed(errno.ESTALE, problem, path)
                if st.st_nlink == 1:  # never the mode of a file linked from elsewhere too
                    os.fchmod(src, 0o600)  # cache files carry configs: owner only
                    st = os.fstat(src)  # the ctime the chmod gave it
                with self._dest_dir(dest) as dest_dir:
                    self._move_at(src, st, src_dir, name, dest_dir, dest, root, path)
            finally:
                os.close(src)
        return dest

    @contextlib.contextmanager
    def _dest_dir(self, dest: str) -> Iterator[int]:
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            with opened_dir(self.root, os.path.dirname(dest), create=True) as dest_dir:
                yield dest_dir
        except FileNotFoundError as err:  # not the source: that it is gone means freed
            raise QuarantineError(errno.ENOENT, f"quarantine: {describe_oserror(err)}", dest) from None

    def _move_at(
        self, src: int, st: os.stat_result, src_dir: int, name: str, dest_dir: int, dest: str, root: str, path: str
    ) -> None:
        dest_name = os.path.basename(dest)
        try:
            os.stat(dest_name, dir_fd=dest_dir, follow_symlinks=False)
            raise QuarantineError(errno.EEXIST, "already exists", dest)
        except FileNotFoundError:
            pass
        try:
            os.rename(name, dest_name, src_dir_fd=src_dir, dst_dir_fd=dest_dir)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
        else:
            moved = os.stat(dest_name, dir_fd=dest_dir, follow_symlinks=False)
            if (moved.st_dev, moved.st_ino) != (st.st_dev, st.st_ino):
                raise Changed(errno.ESTALE, f"replaced as it was moved; what was there is now {dest}", path)
            return
        # Another filesystem: copy what the checked fd holds, then unlink that same inode.
        out = os.open(
            dest_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dest_dir
        )
        try:
            copied = 0
            while chunk := os.read(src, _COPY_CHUNK):
                copied += len(chunk)
                if copied > MAX_QUARANTINE_BYTES:
                    raise QuarantineError(errno.EFBIG, f"over {MAX_QUARANTINE_BYTES} bytes", path)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
            os.fsync(out)
        except OSError:
            os.unlink(dest_name, dir_fd=dest_dir)
            raise
        finally:
            os.close(out)
        unlink_beneath(root, path, same_file(st))


def remove_or_quarantine(root: str, path: str, judged: os.stat_result, quarantine: Quarantine | None) -> Done:
    """Unlink `path` beneath `root` while it is still the inode `judged`, or move it into the
    quarantine when there is one."""
    try:
        if quarantine is not None:
            return Done.moved(quarantine.move(root, path, judged))
        unlink_beneath(root, path, same_file(judged))
    except FileNotFoundError:
        return Done.freed()
    except OSError as err:
        return Done.left(describe_oserror(err))
    return Done.freed()
