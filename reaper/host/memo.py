"""What unchanged files parsed to last pass, so that a file is parsed once while it stays the same.

A file is unchanged when device, inode, size, mtime and ctime are; one changed less than
RACY_NS before the pass is not remembered. Nothing acts on a remembered value without reading
the file again. The agent's memo lives in memory only. Why: docs/design.md, "The file memo".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, cast

T = TypeVar("T")

# (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)
Stamp = tuple[int, int, int, int, int]

RACY_NS = 2_000_000_000  # a file changed this close to the start of a pass is read next time too


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


Clock = Callable[[], int]  # nanoseconds since the epoch, as file times are


class FileMemo(Generic[T]):
    def __init__(self, clock: Clock = time.time_ns) -> None:
        self._previous: dict[str, tuple[Stamp, T]] = {}
        self._current: dict[str, tuple[Stamp, T]] = {}
        self._clock = clock
        self.since_ns = clock() - RACY_NS  # files changed after this are not remembered

    def get(self, path: str, st: os.stat_result) -> T | None:
        hit = self._previous.get(path)
        if hit is None or hit[0] != stamp(st):
            return None
        self._current[path] = hit
        return hit[1]

    def put(self, path: str, st: os.stat_result, value: T) -> None:
        if st.st_ctime_ns >= self.since_ns or st.st_mtime_ns >= self.since_ns:
            return  # racily clean: a same-size rewrite in the same clock tick would look unchanged
        self._current[path] = (stamp(st), value)

    def forget(self, path: str) -> None:
        """Keep nothing of `path` from this pass: it is read again next pass."""
        self._current.pop(path, None)

    def __len__(self) -> int:
        """Files remembered this pass."""
        return len(self._current)

    def end_pass(self) -> None:
        """Forget files not seen this pass."""
        self._previous, self._current = self._current, {}

    def start_pass(self) -> None:
        self.since_ns = self._clock() - RACY_NS

    def items(self) -> Iterator[tuple[str, Stamp, T]]:
        """What the last finished pass remembered."""
        return ((path, st, value) for path, (st, value) in self._previous.items())


class OutputMemo:
    """What a command's output parsed to last pass: an output whose `key` (the text, or the text
    less what the parse never reads) is exactly last pass's is not parsed again; results unused
    in a pass are forgotten at its end. Also reads several kinds share within one pass."""

    def __init__(self) -> None:
        self._previous: dict[str, tuple[str, object]] = {}
        self._current: dict[str, tuple[str, object]] = {}
        self._this_pass: dict[str, object] = {}

    def parsed(self, name: str, key: str, parse: Callable[[], T]) -> T:
        hit = self._previous.get(name)
        value = hit[1] if hit is not None and hit[0] == key else parse()
        self._current[name] = (key, value)
        return cast(T, value)

    def once_a_pass(self, name: str, make: Callable[[], T]) -> T:
        """What `make` gave the first time `name` was asked this pass (reaper.kinds.iptables.SaveRound)."""
        if name not in self._this_pass:
            self._this_pass[name] = make()
        return cast(T, self._this_pass[name])

    def start_pass(self) -> None:
        self._this_pass.clear()

    def end_pass(self) -> None:
        self._previous, self._current = self._current, {}
        self._this_pass.clear()


class InventoryMemo:
    """One FileMemo per kind of file, the command outputs' memo, and what a kind keeps (`kept`)."""

    def __init__(self, clock: Clock = time.time_ns) -> None:
        self._memos: dict[str, FileMemo[object]] = {}
        self._clock = clock
        self.outputs = OutputMemo()
        self._kept: dict[str, object] = {}

    def kept(self, name: str, make: type[T]) -> T:
        """The `make` instance kept under `name` (such as reaper.host.nsmounts.ParsedMountinfo)."""
        held = self._kept.get(name)
        if not isinstance(held, make):
            held = self._kept[name] = make()
        return held

    def of(self, kind: str) -> FileMemo[object]:
        memo = self._memos.get(kind)
        if memo is None:
            memo = self._memos[kind] = FileMemo(self._clock)
        return memo

    def start_pass(self) -> None:
        for memo in self._memos.values():
            memo.start_pass()
        self.outputs.start_pass()

    def end_pass(self) -> None:
        for memo in self._memos.values():
            memo.end_pass()
        self.outputs.end_pass()
