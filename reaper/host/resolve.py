"""A path (a runtime's socket, an iptables tool) resolved one component at a time, inside a root,
every step checked.

Each component is opened `O_PATH | O_NOFOLLOW` from the one before; symlinks are followed by
hand (absolute ones from the root, never above it; none in /proc). With `checked`, every
directory, link and the file must be root's alone (a directory may be sticky). Why:
docs/design.md, "Resolving a path by hand".
"""

from __future__ import annotations

import os
import stat
from collections import deque

from msgspec import Struct

from reaper.host.confined import fstatfs_type
from reaper.host.files import PROC_SUPER_MAGIC

# The kernel's own bound on the symlinks one lookup follows (MAXSYMLINKS, fs/namei.c).
MAX_LINKS = 40
_OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class Resolved(Struct, frozen=True):
    """The file the path leads to, open O_PATH (the caller closes it), and its (device, inode)."""

    fd: int
    key: tuple[int, int]
    mode: int
    uid: int


class Unfollowed(Struct, frozen=True):
    """Why the path, which exists, could not be followed; `key`: the (device, inode) the reason
    is about (one link reached by two spellings is one problem)."""

    reason: str
    key: tuple[int, int]


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    )
    return next((name for test, name in kinds if test(mode)), "an unknown kind of file")


def _distrusted(where: str, st: os.stat_result) -> str | None:
    """Why a component is not root's alone (this process's own uid trusted as root); None when it is."""
    if st.st_uid not in (0, os.geteuid()):
        return f"{where} is owned by uid {st.st_uid}, not root"
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{where} may be written by others than root (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _shown(names: list[str], name: str | None = None) -> str:
    return "/" + "/".join([*names, name] if name is not None else names)


def resolve_in_root(root_fd: int, path: str, *, checked: bool) -> Resolved | Unfollowed | None:
    """`path` (absolute) resolved with `root_fd` as "/"; None when it does not exist. `root_fd`
    stays open; with `checked`, the root is checked too."""
    if not path.startswith("/"):
        raise ValueError(f"not an absolute path: {path!r}")
    original = _parts(path)
    if not original:
        raise ValueError("the root itself is no socket path")
    # (name, is the path's own last component): missing before that one, the path does not
    # exist; once it was found, a missing one is a dangling symlink.
    todo: deque[tuple[str, bool]] = deque((name, i == len(original) - 1) for i, name in enumerate(original))
    stack: list[int] = [root_fd]  # the directories walked down, the root first
    names: list[str] = []  # their names, as the walk spells them (for the reasons)
    last_found = False
    links = 0
    link_key = (0, 0)  # the last symlink followed: what a dangling one is reported by
    root_st = os.fstat(root_fd)
    where_key = (root_st.st_dev, root_st.st_ino)
    if checked and (problem := _distrusted("/", root_st)):
        return Unfollowed(problem, where_key)
    try:
        while todo:
            name, is_last = todo.popleft()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    names.pop()
                continue
            try:
                fd = os.open(name, _OPEN, dir_fd=stack[-1])
            except (FileNotFoundError, NotADirectoryError):
                if not last_found:
                    return None
                return Unfollowed(f"{_shown(names, name)} does not exist (a dangling symlink)", link_key)
            except OSError as err:
                return Unfollowed(f"{_shown(names, name)}: {err.strerror}", where_key)
            keep = False
            try:
                st = os.fstat(fd)
                where_key = (st.st_dev, st.st_ino)
                where = _shown(names, name)
                last_found = last_found or is_last
                if checked and (problem := _distrusted(where, st)):
                    return Unfollowed(problem, where_key)
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    link_key = where_key
                    if links > MAX_LINKS:
                        return Unfollowed(f"more than {MAX_LINKS} symlinks on the way (a loop?) at {where}", where_key)
                    if fstatfs_type(fd) == PROC_SUPER_MAGIC:
                        return Unfollowed(f"{where} is a link in /proc, never followed", where_key)
                    target = os.readlink("", dir_fd=fd)
                    if not target:
                        return Unfollowed(f"{where} is an empty symlink", where_key)
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop())
                        names.clear()
                    todo.extendleft(reversed([(part, False) for part in _parts(target)]))
                    continue
                if not todo:
                    keep = True
                    return Resolved(fd, where_key, st.st_mode, st.st_uid)
                if not stat.S_ISDIR(st.st_mode):
                    if not last_found:
                        return None
                    return Unfollowed(f"{where} is {_kind(st.st_mode)}, not a directory", where_key)
                stack.append(fd)
                names.append(name)
                keep = True
            finally:
                if not keep:
                    os.close(fd)
        # The walk ended on a directory (a path ending in "..").
        return Unfollowed(f"{_shown(names)} is a directory", where_key)
    finally:
        for fd in stack[1:]:
            os.close(fd)


def checked_socket(path: str, root: str | None = None) -> Resolved | Unfollowed | None:
    """`path` in `root` ("/" when None) resolved `checked`; Unfollowed also for a path that exists
    and is no socket; None when it does not exist."""
    top = root or "/"
    try:
        root_fd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        return Unfollowed(f"{top}: {err.strerror}", (0, 0))
    try:
        st = os.fstat(root_fd)
        try:
            found = resolve_in_root(root_fd, path, checked=True)
        except OSError as err:
            return Unfollowed(f"{path}: {err.strerror}", (st.st_dev, st.st_ino))
        except ValueError:  # a kubelet's endpoint with a NUL byte in it
            return Unfollowed(f"{path!r} is no path", (st.st_dev, st.st_ino))
    finally:
        os.close(root_fd)
    if isinstance(found, Resolved) and not stat.S_ISSOCK(found.mode):
        os.close(found.fd)
        return Unfollowed(f"{path} leads to {_kind(found.mode)}, not a socket", found.key)
    return found
