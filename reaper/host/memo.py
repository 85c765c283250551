"""What unchanged files parsed to last pass, so a long-running agent reads each file once.

A pass still lstat()s every file; a file whose inode, size, mtime and ctime are all the same
is taken as unchanged. Nothing acts on a remembered value without reading the file again
(reclaiming re-reads before it deletes), so a stale entry could only delay a verdict.
"""

from __future__ import annotations

import os
from typing import Generic, TypeVar

T = TypeVar("T")

Stamp = tuple[int, int, int, int]


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileMemo(Generic[T]):
    def __init__(self) -> None:
        self._previous: dict[str, tuple[Stamp, T]] = {}
        self._current: dict[str, tuple[Stamp, T]] = {}

    def get(self, path: str, st: os.stat_result) -> T | None:
        hit = self._previous.get(path)
        if hit is None or hit[0] != stamp(st):
            return None
        self._current[path] = hit
        return hit[1]

    def put(self, path: str, st: os.stat_result, value: T) -> None:
        self._current[path] = (stamp(st), value)

    def __len__(self) -> int:
        """Files remembered this pass."""
        return len(self._current)

    def end_pass(self) -> None:
        """Forget files not seen this pass."""
        self._previous, self._current = self._current, {}


class InventoryMemo:
    """One FileMemo per kind of file, kept by a long-running process; a one-shot run uses a
    fresh one (and gains nothing)."""

    def __init__(self) -> None:
        self._memos: dict[str, FileMemo[object]] = {}

    def of(self, kind: str) -> FileMemo[object]:
        memo = self._memos.get(kind)
        if memo is None:
            memo = self._memos[kind] = FileMemo()
        return memo

    def end_pass(self) -> None:
        for memo in self._memos.values():
            memo.end_pass()
