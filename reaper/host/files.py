"""Directories listed once and beneath their roots; filesystem types; namespace paths."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from reaper.host.confined import fstatfs_type, opened_dir
from reaper.model import CorruptFile, NsKey

NSFS_MAGIC = 0x6E736673
PROC_SUPER_MAGIC = 0x9FA0


def fs_type(path: str) -> int:
    """statfs(2) f_type of the filesystem holding `path`."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        return fstatfs_type(fd)
    finally:
        os.close(fd)


def describe_oserror(err: OSError) -> str:
    return err.strerror or str(err)


def namespace_of(path: str | None) -> NsKey | None:
    """The (dev, ino) a netns path a runtime gave names now; None when empty, relative or gone.
    A runtime's own answer only: a path a file names goes through NetnsPlaces."""
    if not path or not path.startswith("/"):
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL or an unencodable character in it
        return None
    return NsKey(st.st_dev, st.st_ino)


MAX_LISTED_CORRUPT = 1000  # per kind and pass: 100,000 junk files cost a count, not 100,000 records


class CorruptLog:
    """One kind's corrupt records in a pass: the first MAX_LISTED_CORRUPT listed, the rest counted per dir."""

    def __init__(self, kind: str, cap: int = MAX_LISTED_CORRUPT) -> None:
        self.kind = kind
        self.cap = cap
        self._listed: list[CorruptFile] = []
        self._unlisted: dict[str, int] = {}

    def append(self, record: CorruptFile) -> bool:
        """Keep `record`; False when it was only counted."""
        if len(self._listed) < self.cap:
            self._listed.append(record)
            return True
        directory = os.path.dirname(record.path)
        self._unlisted[directory] = self._unlisted.get(directory, 0) + 1
        return False

    def listed(self) -> tuple[CorruptFile, ...]:
        return tuple(self._listed)

    def records(self) -> tuple[CorruptFile, ...]:
        summary = tuple(
            CorruptFile(self.kind, directory, f"{n} more corrupt files here, counted, not listed", n)
            for directory, n in sorted(self._unlisted.items())
        )
        return self.listed() + summary


class DirLister:
    """Lists directories beneath their roots (reaper.host.confined), each once by (dev, ino)
    (/var/run/netns and /run/netns are usually one). A missing directory is empty; one that
    cannot be read is a corrupt record of `kind`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.corrupt = CorruptLog(kind)
        self._seen: set[tuple[int, int]] = set()

    def scan(self, root: str, directory: str) -> Iterator[tuple[int, os.DirEntry[str]]]:
        """(fd of `directory`, entry) for each entry; the fd stays open while they are read."""
        stack = contextlib.ExitStack()
        try:
            fd = stack.enter_context(opened_dir(root, directory))
            st = os.fstat(fd)
        except FileNotFoundError:
            stack.close()
            return
        except OSError as err:
            stack.close()
            self.corrupt.append(CorruptFile(self.kind, directory, describe_oserror(err)))
            return
        with stack:
            if (st.st_dev, st.st_ino) in self._seen:
                return
            self._seen.add((st.st_dev, st.st_ino))
            try:
                with os.scandir(fd) as listing:
                    for entry in listing:
                        yield fd, entry
            except OSError as err:
                self.corrupt.append(CorruptFile(self.kind, directory, describe_oserror(err)))
