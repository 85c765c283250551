"""What unchanged files parsed to last pass, so that a file is parsed once while it stays the same.

A pass still lstat()s every file; a file whose device, inode, size, mtime and ctime are all the
same is taken as unchanged. Two rules keep that true:
- A file changed less than RACY_NS before the pass began is not remembered: the kernel stamps
  times from a coarse clock, so a rewrite of the same size within one tick keeps every stamp
  (git's "racily clean" files). Any later change then shows in ctime, which no one can set.
- Nothing acts on a remembered value without reading the file again (reclaiming re-reads
  before it deletes), and a value stands for what the file's content said, never for where the
  file is: the kinds take path and names from the look itself.

The long-running agent keeps its memo in memory. A one-shot run (a timer's `scan` or `reap`)
loads the memo saved next to the state file and saves it back when it changed: versioned,
written atomically with mode 0600. Its dir is the reaper's own, but a writer of it must gain
nothing: a memo file that is unreadable, of another version or of any other shape is set aside
whole and every file is parsed again, and so is one holding any value its kind's check refuses.
The same holds for what a command's output parsed to at a version the kernel keeps of what the
command prints (OutputMemo.at_version), saved when that version lasts beyond the process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar, cast

import msgspec

from reaper.host.atomic import write_atomically
from reaper.host.confined import UnfitFile, read_beneath
from reaper.host.files import describe_oserror

T = TypeVar("T")

# (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)
Stamp = tuple[int, int, int, int, int]

RACY_NS = 2_000_000_000  # a file changed this close to the start of a pass is read next time too
MEMO_VERSION = 2  # bump whenever what a kind keeps for a file or an output changes shape or meaning
MAX_MEMO_BYTES = 64 << 20
# A kind's check of a value read back from a saved memo: the value as the kind keeps it, or
# None when it is not one (see reaper.kinds.Kind.memo_check).
Check = Callable[[object], object | None]
# A version of what a command prints, as the kernel numbers it: plain strings and integers.
Version = tuple[str | int, ...]


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


Clock = Callable[[], int]  # nanoseconds since the epoch, as file times are


class FileMemo(Generic[T]):
    def __init__(self, clock: Clock = time.time_ns) -> None:
        self._previous: dict[str, tuple[Stamp, T]] = {}
        self._current: dict[str, tuple[Stamp, T]] = {}
        self.changed = False  # since loaded: something remembered anew or forgotten
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
        self.changed = True

    def __len__(self) -> int:
        """Files remembered this pass."""
        return len(self._current)

    def end_pass(self) -> None:
        """Forget files not seen this pass."""
        if self._previous.keys() - self._current.keys():
            self.changed = True
        self._previous, self._current = self._current, {}

    def start_pass(self) -> None:
        self.since_ns = self._clock() - RACY_NS

    def items(self) -> Iterator[tuple[str, Stamp, T]]:
        """What the last finished pass remembered."""
        for path, (st, value) in self._previous.items():
            yield path, st, value

    def load(self, rows: list[tuple[str, Stamp, T]]) -> None:
        self._previous = {path: (st, value) for path, st, value in rows}


class OutputMemo:
    """What a command's output parsed to last pass: an output whose `key` (the whole text, or
    the text less what the parse never reads) is the same as last pass's is not parsed again.
    An exact comparison, so nothing can be stale.

    And what a command's output parsed to at a version of what it prints, for a command that
    prints only what a version number of the kernel's stands for (`iptables-nft-save` and the
    nftables ruleset's generation): the command is not run again while the version is the same,
    read before each run. A result whose version lasts beyond this process (see
    reaper.kinds.iptables) is saved with a one-shot's memo, under a command named
    "<kind>:<command>" so that its kind's check reads it back. Results not used in a pass are
    forgotten at its end."""

    def __init__(self) -> None:
        self._previous: dict[str, tuple[str, object]] = {}
        self._current: dict[str, tuple[str, object]] = {}
        self._at_before: dict[str, tuple[Version, object, bool]] = {}
        self._at_now: dict[str, tuple[Version, object, bool]] = {}
        self.changed = False  # since loaded: a lasting result kept anew or forgotten

    def parsed(self, name: str, key: str, parse: Callable[[], T]) -> T:
        hit = self._previous.get(name)
        value = hit[1] if hit is not None and hit[0] == key else parse()
        self._current[name] = (key, value)
        return cast(T, value)

    def at_version(self, command: str, version: Version) -> object | None:
        """What `command`'s output parsed to last pass, when it ran at this same `version`."""
        hit = self._at_before.get(command)
        return hit[1] if hit is not None and hit[0] == version else None

    def keep_at_version(self, command: str, version: Version, value: object, lasting: bool) -> None:
        """`command`, run after `version` was read, printed what parsed to `value`. `lasting`:
        the version means the same in another process (saved with a one-shot's memo)."""
        self._at_now[command] = (version, value, lasting)
        before = self._at_before.get(command)
        if lasting and (before is None or before[0] != version):
            self.changed = True

    def lasting(self) -> Iterator[tuple[str, Version, object]]:
        """The lasting results the last finished pass kept."""
        for command, (version, value, lasting) in self._at_before.items():
            if lasting:
                yield command, version, value

    def load(self, rows: Iterable[tuple[str, Version, object]]) -> None:
        self._at_before = {command: (version, value, True) for command, version, value in rows}

    def end_pass(self) -> None:
        if any(kept[2] for command, kept in self._at_before.items() if command not in self._at_now):
            self.changed = True
        self._previous, self._current = self._current, {}
        self._at_before, self._at_now = self._at_now, {}


class InventoryMemo:
    """One FileMemo per kind of file, and the memo of command outputs (kept in memory only)."""

    def __init__(self, clock: Clock = time.time_ns) -> None:
        self._memos: dict[str, FileMemo[object]] = {}
        self._clock = clock
        self.outputs = OutputMemo()

    def of(self, kind: str) -> FileMemo[object]:
        memo = self._memos.get(kind)
        if memo is None:
            memo = self._memos[kind] = FileMemo(self._clock)
        return memo

    def start_pass(self) -> None:
        for memo in self._memos.values():
            memo.start_pass()

    def end_pass(self) -> None:
        for memo in self._memos.values():
            memo.end_pass()
        self.outputs.end_pass()

    @property
    def changed(self) -> bool:
        return self.changed_in(self._memos)

    def changed_in(self, kinds: Iterable[str]) -> bool:
        """Whether the memo of any of `kinds` changed, or a lasting command result (a one-shot
        saves only some kinds)."""
        return self.outputs.changed or any(self._memos[kind].changed for kind in kinds if kind in self._memos)


# ------------------------------------------------------------------ saved next to the state file


class _Saved(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    kinds: dict[str, list[tuple[str, tuple[int, int, int, int, int], Any]]]
    outputs: list[tuple[str, list[str | int], Any]] = []  # (kind:command, version, parsed)


def _kind_of(command: str) -> str:
    return command.split(":", 1)[0]


def memo_path(state_file: str) -> str:
    return f"{state_file}.memo"


def load_memo(path: str, checks: Mapping[str, Check], clock: Clock = time.time_ns) -> tuple[InventoryMemo, str | None]:
    """The memo saved at `path`, each value checked by its kind's check in `checks`; an empty
    one (and why, when the file is there) if anything in it is not what this version saves."""
    try:
        raw, _ = read_beneath(os.path.dirname(path), path, MAX_MEMO_BYTES)
        saved = msgspec.json.decode(raw, type=_Saved)
        if saved.version != MEMO_VERSION:
            raise ValueError(f"version {saved.version}, not {MEMO_VERSION}")
        loaded: dict[str, list[tuple[str, Stamp, object]]] = {}
        for kind, rows in saved.kinds.items():
            check = checks.get(kind)
            if check is None:
                raise ValueError(f"kind {kind[:40]!r} is not one this version saves")
            loaded[kind] = [(p, st, _checked(check(value), kind)) for p, st, value in rows]
        outputs: list[tuple[str, Version, object]] = []
        for command, version, value in saved.outputs:
            check = checks.get(_kind_of(command))
            if check is None:
                raise ValueError(f"output {command[:40]!r} is not one this version saves")
            outputs.append((command, tuple(version), _checked(check(value), _kind_of(command))))
    except FileNotFoundError:
        return InventoryMemo(clock), None
    except (OSError, UnfitFile, ValueError, RecursionError) as err:  # msgspec's errors are ValueErrors
        text = describe_oserror(err) if isinstance(err, OSError) else str(err)[:200]
        return InventoryMemo(clock), f"memo {path} not used ({text}); every file is read again"
    memo = InventoryMemo(clock)
    for kind, kept in loaded.items():
        memo.of(kind).load(kept)
    memo.outputs.load(outputs)
    return memo, None


def _checked(value: object | None, kind: str) -> object:
    if value is None:
        raise ValueError(f"a value its kind ({kind}) does not keep")
    return value


def save_memo(path: str, memo: InventoryMemo, kinds: Iterable[str]) -> None:
    """Write the memos of `kinds` and their lasting command results atomically, mode 0600
    (their plain values: a kind's memo may also hold records kept in memory only, such as
    corrupt files); OSError when it cannot be."""
    kinds = set(kinds)
    rows = {kind: [row for row in memo.of(kind).items() if isinstance(row[2], tuple)] for kind in kinds}
    saved = {kind: kept for kind, kept in rows.items() if kept}
    outputs = [row for row in memo.outputs.lasting() if _kind_of(row[0]) in kinds]
    doc = {"version": MEMO_VERSION, "kinds": saved, "outputs": outputs}
    write_atomically(path, msgspec.json.encode(doc), 0o600)
