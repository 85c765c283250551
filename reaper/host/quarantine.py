"""--quarantine-dir: keep a reclaimed lease or cache file (under its original path) for an undo.

Both ends are reached beneath their roots (reaper.host.confined), the file checked to be the
regular file that was judged; across mounts the move is a bounded, fsynced copy from that fd,
then an unlinkat of the same inode. --quarantine-max-age (expire) deletes only the reaper's own
records: regular files beneath a `<dir>/<time>/` it named, still the inode judged; anything
else there is left and said.
"""

from __future__ import annotations

import calendar
import contextlib
import errno
import os
import re
import stat
import time
from collections.abc import Iterator

from msgspec import Struct

from reaper.host.confined import Changed, RootRefused, opened_dir, same_file, unlink_beneath
from reaper.host.files import describe_oserror
from reaper.model import Done

MAX_QUARANTINE_BYTES = 16 << 20  # larger than any lease or cache file the reaper reads
_COPY_CHUNK = 1 << 16
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"  # a pass's <time>/ dir: when its files were moved, UTC
_STAMP_NAME = re.compile(r"\d{8}T\d{6}Z")
MAX_EXPIRED_PER_PASS = 10_000  # files one pass deletes; the rest go at the next pass
MAX_LEFT_SAID = 5  # lines about what was left, at most, per pass
MAX_NAMES_READ = 100_000  # names read from one directory: a pass's memory, whatever is put there
# Dirs deep beneath a <time>/ dir: an original path is a few; a deeper tree is not the
# reaper's, and walking it would cost an fd a level.
MAX_DEPTH = 32
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class QuarantineError(OSError):
    pass


class Quarantine:
    def __init__(self, directory: str, now: float | None = None) -> None:
        self.root = os.path.abspath(directory)
        self.stamp = time.strftime(STAMP_FORMAT, time.gmtime(now if now is not None else time.time()))

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
    """Unlink `path` beneath `root` while still the inode `judged`, or move it into the quarantine if there is one."""
    try:
        if quarantine is not None:
            return Done.moved(quarantine.move(root, path, judged))
        unlink_beneath(root, path, same_file(judged))
    except FileNotFoundError:
        return Done.freed()
    except OSError as err:
        return Done.left(describe_oserror(err))
    return Done.freed()


class Expiry(Struct, frozen=True, kw_only=True):
    """What one expire() did: files deleted, and a line for each of the first things left."""

    deleted: int = 0
    left: tuple[str, ...] = ()
    more_left: int = 0  # things left beyond those said


def stamp_time(name: str) -> float | None:
    """The epoch time a quarantine directory's name says; None for a name the reaper never gives."""
    if not _STAMP_NAME.fullmatch(name):
        return None
    try:
        return float(calendar.timegm(time.strptime(name, STAMP_FORMAT)))
    except ValueError:  # 20261399T... has the digits but no such date
        return None


def _names(dir_fd: int) -> list[str]:
    """At most MAX_NAMES_READ names in the open directory, sorted (<time>/ names: oldest first)."""
    with os.scandir(dir_fd) as entries:
        return sorted(entry.name for _, entry in zip(range(MAX_NAMES_READ), entries, strict=False))


class _Expiring(Struct, kw_only=True):
    deleted: int = 0
    left: list[str] = []
    more_left: int = 0

    def leave(self, path: str, why: str) -> None:
        if len(self.left) < MAX_LEFT_SAID:
            self.left.append(f"{path}: {why}")
        else:
            self.more_left += 1

    def full(self) -> bool:
        return self.deleted >= MAX_EXPIRED_PER_PASS

    def clear(self, dir_fd: int, path: str, depth: int) -> bool:
        """Delete the regular files beneath the open directory `dir_fd` (at `path`, `depth`
        below its <time>/ dir), then its emptied subdirectories; True when nothing is left."""
        if depth > MAX_DEPTH:
            self.leave(path, f"more than {MAX_DEPTH} dirs deep, so not a tree the reaper made")
            return False
        empty = True
        for name in _names(dir_fd):
            if self.full():
                return False
            where = os.path.join(path, name)
            try:
                judged = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(judged.st_mode):
                    if not self.clear_subdir(dir_fd, name, where, judged, depth + 1):
                        empty = False
                    continue
                if not stat.S_ISREG(judged.st_mode):
                    self.leave(where, "not a regular file, so not one the reaper quarantined")
                    empty = False
                    continue
                problem = same_file(judged)(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
                if problem is not None:
                    self.leave(where, problem)
                    empty = False
                    continue
                os.unlink(name, dir_fd=dir_fd)
                self.deleted += 1
            except FileNotFoundError:
                continue  # gone already: nothing to delete
            except OSError as err:
                self.leave(where, describe_oserror(err))
                empty = False
        return empty

    def clear_subdir(self, dir_fd: int, name: str, where: str, judged: os.stat_result, depth: int = 0) -> bool:
        fd = os.open(name, _DIR_OPEN, dir_fd=dir_fd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (judged.st_dev, judged.st_ino):
                self.leave(where, "replaced as it was opened")
                return False
            emptied = self.clear(fd, where, depth)
        finally:
            os.close(fd)
        if emptied:
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except OSError as err:  # ENOTEMPTY: something was put there meanwhile
                if err.errno != errno.ENOENT:
                    self.leave(where, describe_oserror(err))
                    return False
        return emptied


def expire(directory: str, max_age: float, now: float) -> Expiry:
    """Delete the regular files beneath each `<time>/` directory in `directory` older than
    `max_age` at `now`, then the directories so emptied."""
    root = os.path.abspath(directory)
    run = _Expiring()
    try:
        with opened_dir(root, root) as root_fd:
            for name in _names(root_fd):
                moved_at = stamp_time(name)
                if moved_at is None or now - moved_at <= max_age:
                    continue  # not the reaper's, or not old enough (a time ahead of the clock too)
                if run.full():
                    break
                where = os.path.join(root, name)
                try:
                    judged = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
                    if not stat.S_ISDIR(judged.st_mode):
                        run.leave(where, "not a directory, so not one the reaper made")
                        continue
                    run.clear_subdir(root_fd, name, where, judged)
                except FileNotFoundError:
                    continue
                except OSError as err:
                    run.leave(where, describe_oserror(err))
    except FileNotFoundError:
        return Expiry()
    except RootRefused as err:
        return Expiry(left=(f"{root}: {describe_oserror(err)}",))
    return Expiry(deleted=run.deleted, left=tuple(run.left), more_left=run.more_left)
