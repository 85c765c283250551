"""--quarantine-max-age: what the reaper quarantined longer ago than that is deleted, its own
records only (reaper.host.quarantine.expire), on a real directory tree."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from reaper.host import quarantine
from reaper.host.quarantine import MAX_DEPTH, MAX_LEFT_SAID, Quarantine, expire, stamp_time

DAY = 86400.0
NOW = 1_800_000_000.0  # 2027-01-15


def quarantined(root: Path, at: float, path: str, content: bytes = b"{}") -> Path:
    """A file as Quarantine.move leaves it: <root>/<time of the move>/<its original path>."""
    dest = Path(Quarantine(str(root), now=at).destination(path))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(content)
    return dest


def test_the_stamp_is_the_time_the_reaper_wrote() -> None:
    assert stamp_time(Quarantine("/q", now=NOW).stamp) == NOW
    for other in ("notes", "20270115T080000", "20271399T000000Z", "2027-01-15T08:00:00Z", "x20270115T080000Z"):
        assert stamp_time(other) is None, other


def test_older_than_max_age_is_deleted_with_its_dirs_the_rest_kept(tmp_path: Path) -> None:
    root = tmp_path / "quarantine"
    old = quarantined(root, NOW - 8 * DAY, "/var/lib/cni/networks/pod-net/10.0.0.7")
    old_cache = quarantined(root, NOW - 8 * DAY, "/var/lib/cni/results/pod-net-abc-eth0")
    young = quarantined(root, NOW - 6 * DAY, "/var/lib/cni/networks/pod-net/10.0.0.9")
    ahead = quarantined(root, NOW + DAY, "/var/lib/cni/networks/pod-net/10.0.0.11")  # a clock set back

    done = expire(str(root), 7 * DAY, NOW)

    assert done.deleted == 2 and done.left == ()
    assert not old.exists() and not old_cache.exists()
    # Its whole <time>/ tree went once emptied; the younger ones are as they were.
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [Quarantine(str(root), now=NOW - 6 * DAY).stamp, Quarantine(str(root), now=NOW + DAY).stamp]
    )
    assert young.read_bytes() == b"{}" and ahead.exists()


def test_only_the_reapers_own_records_are_touched(tmp_path: Path) -> None:
    """A name the reaper does not give, a symlink (followed nowhere), a fifo: left, and said."""
    root = tmp_path / "quarantine"
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep").write_text("x")
    old_dir = Path(quarantined(root, NOW - 30 * DAY, "/var/lib/cni/networks/n/10.0.0.2")).parents[5]
    assert stamp_time(old_dir.name) is not None
    os.symlink(outside, old_dir / "var" / "link-to-dir")
    os.symlink(outside / "keep", old_dir / "link-to-file")
    os.mkfifo(old_dir / "fifo")
    mine_not = root / "operator-notes"
    mine_not.mkdir()
    (mine_not / "readme").write_text("kept")
    os.utime(mine_not / "readme", (NOW - 99 * DAY, NOW - 99 * DAY))
    (root / "20200101T000000Z.tar").write_text("a file named like a time, not a dir")
    # A time-named symlink to a directory outside: never entered.
    os.symlink(outside, root / "20200102T000000Z")

    done = expire(str(root), DAY, NOW)

    assert done.deleted == 1  # the lease file; nothing else
    assert (outside / "keep").read_text() == "x"
    assert (mine_not / "readme").read_text() == "kept"
    assert (root / "20200101T000000Z.tar").exists() and (root / "20200102T000000Z").is_symlink()
    assert os.path.islink(old_dir / "link-to-file") and os.path.exists(old_dir / "fifo")
    said = "\n".join(done.left)
    assert "link-to-file: not a regular file" in said and "fifo: not a regular file" in said
    assert "20200102T000000Z: not a directory" in said
    assert len(done.left) <= MAX_LEFT_SAID


def test_a_file_that_changed_after_it_was_judged_is_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compare of compare-and-delete: a file that is no longer what was judged (here: the
    check right before the unlink says so, as it would for a rewrite in between) is left."""
    root = tmp_path / "quarantine"
    kept = quarantined(root, NOW - 9 * DAY, "/var/lib/cni/networks/n/10.0.0.4")
    gone = quarantined(root, NOW - 9 * DAY, "/var/lib/cni/networks/n/10.0.0.5")
    kept_ino = kept.stat().st_ino

    def rewritten_meanwhile(judged: os.stat_result) -> Callable[[os.stat_result], str | None]:
        return lambda now: "changed since it was read" if now.st_ino == kept_ino else None

    monkeypatch.setattr(quarantine, "same_file", rewritten_meanwhile)
    done = expire(str(root), DAY, NOW)
    assert done.deleted == 1 and not gone.exists() and kept.exists()
    assert done.left == (f"{kept}: changed since it was read",)


def test_a_missing_quarantine_dir_has_nothing_to_expire(tmp_path: Path) -> None:
    done = expire(str(tmp_path / "none"), DAY, time.time())
    assert (done.deleted, done.left) == (0, ())


def test_a_symlinked_quarantine_root_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    quarantined(real, NOW - 9 * DAY, "/var/lib/cni/networks/n/10.0.0.3")
    link = tmp_path / "link"
    link.symlink_to(real)
    done = expire(str(link), DAY, NOW)
    assert done.deleted == 0 and "is a symlink" in done.left[0]
    assert any(real.rglob("10.0.0.3"))


def test_a_tree_deeper_than_the_reaper_makes_is_left_not_walked_to_the_end(tmp_path: Path) -> None:
    """A stamp dir holding thousands of nested dirs (root's dir, but a wrong quarantineDir may be
    shared) costs a bounded walk and a line, never a RecursionError that would stop the pass."""
    root = tmp_path / "quarantine"
    stamp = Path(Quarantine(str(root), now=NOW - 9 * DAY).destination("/x")).parent
    deep = stamp
    for _ in range(MAX_DEPTH + 5):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "lease").write_text("x")
    done = expire(str(root), DAY, NOW)
    assert done.deleted == 0 and (deep / "lease").exists()
    assert f"more than {MAX_DEPTH} dirs deep" in done.left[0]


def test_a_directory_of_more_names_than_a_pass_reads_is_read_in_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer of the quarantine dir filling one directory with names costs a pass a bounded
    read (MAX_NAMES_READ), not every name: what is left goes at a later pass."""
    monkeypatch.setattr(quarantine, "MAX_NAMES_READ", 3)
    root = tmp_path / "quarantine"
    for n in range(5):
        quarantined(root, NOW - 30 * DAY, f"/var/lib/cni/networks/n/10.0.0.{n}")
    first = expire(str(root), 7 * DAY, NOW)
    assert first.deleted == 3
    assert expire(str(root), 7 * DAY, NOW).deleted == 2
    assert list(root.iterdir()) == []
