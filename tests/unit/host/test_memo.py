"""The memo of parsed files and command outputs the long-running agent keeps in memory.

It must never make a changed file look unchanged. A one-shot run keeps none (see reaper.scan).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reaper.host.memo import InventoryMemo, OutputMemo, stamp
from reaper.kinds.cache import collect_cache
from reaper.kinds.hostlocal import collect_leases
from tests.harness.configs import cache_doc
from tests.harness.passes import settled_memo, write_private

REAL = "a" * 64
FORGED = "f" * 64
NET = "mynet"


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A cache dir with one entry and a data dir with one lease, both naming REAL."""
    entry = write_private(tmp_path / "cni" / "results", f"{NET}-{REAL}-eth0", json.dumps(cache_doc(REAL, NET)).encode())
    lease = write_private(tmp_path / "ipam" / NET, "10.88.0.5", f"{REAL}\r\neth0".encode())
    return tmp_path / "cni", entry, lease


def _look(tmp_path: Path, memo: InventoryMemo) -> tuple[set[str], set[str]]:
    """The container IDs the cache entries and the leases name, in one pass with `memo`."""
    memo.start_pass()
    entries = collect_cache(str(tmp_path / "cni"), set(), memo.of("cache")).entries
    leases, _ = collect_leases([str(tmp_path / "ipam")], memo.of("ipam"))
    memo.end_pass()
    return {e.container_id for e in entries}, {lease.container_id for lease in leases}


def _remembered_as_forged(tmp_path: Path) -> InventoryMemo:
    """A memo that has looked at the tree once and then remembers each file, at its present
    stamp, as naming FORGED: what a look gives while it holds shows the memo was used."""
    memo = settled_memo()
    _look(tmp_path, memo)
    memo.start_pass()
    for kind in ("cache", "ipam"):
        for path, _, value in list(memo.of(kind).items()):
            assert isinstance(value, tuple)
            memo.of(kind).put(path, os.lstat(path), (FORGED, *value[1:]))
    memo.end_pass()
    return memo


def test_a_remembered_value_stands_for_the_file_only_while_every_key_is_the_same(tmp_path: Path) -> None:
    _, entry, lease = _tree(tmp_path)
    st = entry.stat()
    assert stamp(st) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    # Unchanged files: the memo is what is read, which shows that it is used at all.
    assert _look(tmp_path, _remembered_as_forged(tmp_path)) == ({FORGED}, {FORGED})
    memo = _remembered_as_forged(tmp_path)
    # The same size and mtime, new content: only ctime tells, and it is part of the key.
    for f in (entry, lease):
        st = f.stat()
        f.write_bytes(f.read_bytes())
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _look(tmp_path, memo) == ({REAL}, {REAL})


@pytest.mark.parametrize("change", ["inode", "size", "mtime"])
def test_any_key_that_differs_makes_the_file_read_again(tmp_path: Path, change: str) -> None:
    _, entry, lease = _tree(tmp_path)
    memo = _remembered_as_forged(tmp_path)
    for f in (entry, lease):
        data, st = f.read_bytes(), f.stat()
        if change == "inode":
            f.unlink()
            f.write_bytes(data)
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        elif change == "size":
            f.write_bytes(data + b" ")
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        else:
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert _look(tmp_path, memo) == ({REAL}, {REAL})


def test_a_file_changed_just_before_the_pass_is_not_remembered(tmp_path: Path) -> None:
    """A rewrite of the same size within one tick of the kernel's coarse clock keeps every
    stamp: a file that recent is read again next pass."""
    _tree(tmp_path)
    memo = InventoryMemo()  # the real clock: the files were written a moment ago
    assert _look(tmp_path, memo) == ({REAL}, {REAL})
    assert len(memo.of("cache")) == len(memo.of("ipam")) == 0


def test_a_command_output_is_parsed_again_unless_its_key_is_the_same() -> None:
    outputs = OutputMemo()
    parses: list[str] = []

    def parsed(name: str, text: str) -> tuple[str, ...]:
        def parse() -> tuple[str, ...]:
            parses.append(text)
            return tuple(text.split())

        return outputs.parsed(name, text, parse)

    assert parsed("save", "a b") == ("a", "b")
    outputs.end_pass()
    assert parsed("save", "a b") == ("a", "b")
    assert parses == ["a b"]  # the same key: last pass's result
    outputs.end_pass()
    assert parsed("save", "a c") == ("a", "c")
    assert parsed("other", "a c") == ("a", "c")  # by command, not by key alone
    assert parses == ["a b", "a c", "a c"]
    outputs.end_pass()
    outputs.end_pass()  # a pass that did not run the command forgets its output
    assert parsed("save", "a c") == ("a", "c")
    assert parses == ["a b", "a c", "a c", "a c"]
