"""The lock beside the state file: held by one open file at a time, opened without following or
truncating what is planted there, its holder's record read back as bounded printable text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reaper.host.passlock import RECORD_BYTES, LockBusy, LockUnusable, holder_text, lock_path, take_lock


def test_a_held_lock_names_its_holder_to_the_next(tmp_path: Path) -> None:
    state = str(tmp_path / "state" / "state.json")
    told: list[str] = []
    with take_lock(state, 0, "reaper reap --dry-run") as held:
        assert held.held and held.path == f"{state}.lock"
        with pytest.raises(LockBusy) as busy:
            take_lock(state, 0.3, "reaper scan", on_wait=told.append)
    assert str(busy.value) == (
        f"another reaper holds {state}.lock (pid {os.getpid()}: reaper reap --dry-run); waited 0.3s, nothing done"
    )
    assert told == [f"pid {os.getpid()}: reaper reap --dry-run"], "the wait is told once, with the holder"
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    assert Path(f"{state}.lock").stat().st_mode & 0o777 == 0o600
    with take_lock(state, 0, "reaper scan"):  # let go at the end of the with
        pass


def test_a_waiter_told_to_give_up_stops_waiting(tmp_path: Path) -> None:
    state = str(tmp_path / "state.json")
    asked: list[float] = []

    def stopping(seconds: float) -> bool:
        asked.append(seconds)
        return True

    with take_lock(state, 0, "reaper run"), pytest.raises(LockBusy):
        take_lock(state, 3600, "reaper run", pause=stopping)
    assert len(asked) == 1


def test_the_lock_goes_to_no_child(tmp_path: Path) -> None:
    """A process the holder starts (a plugin that outlives its DEL) holds nothing after it."""
    state = str(tmp_path / "state.json")
    lock = take_lock(state, 0, "reaper reap")
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        close_fds=False,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"  # its exec is over
        lock.release()
        with take_lock(state, 0, "reaper reap"):
            pass
    finally:
        child.kill()
        child.wait()


def test_a_symlink_at_the_lock_path_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "shadow"
    target.write_text("root:x:0:0\n")
    (tmp_path / "state.json.lock").symlink_to(target)
    with pytest.raises(LockUnusable, match="a symlink is there; remove it"):
        take_lock(str(tmp_path / "state.json"), 0, "reaper reap")
    assert target.read_text() == "root:x:0:0\n"


def test_a_hard_link_at_the_lock_path_is_refused_before_a_byte_is_written(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_text("another file's bytes\n")
    os.link(other, tmp_path / "state.json.lock")
    with pytest.raises(LockUnusable, match="not a regular file of this user's own with one name"):
        take_lock(str(tmp_path / "state.json"), 0, "reaper reap")
    assert other.read_text() == "another file's bytes\n"


def test_a_fifo_at_the_lock_path_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json.lock")
    with pytest.raises(LockUnusable, match="not a regular file"):
        take_lock(str(tmp_path / "state.json"), 0, "reaper reap")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_another_users_file_at_the_lock_path_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "state.json.lock"
    planted.write_text("")
    os.chown(planted, 65534, 65534)
    with pytest.raises(LockUnusable, match="of this user's own"):
        take_lock(str(tmp_path / "state.json"), 0, "reaper reap")


def test_the_record_is_written_over_never_truncating(tmp_path: Path) -> None:
    path = Path(lock_path(str(tmp_path / "state.json")))
    path.write_bytes(b"x" * (RECORD_BYTES * 4))
    path.chmod(0o600)
    with take_lock(str(tmp_path / "state.json"), 0, "reaper scan"):
        data = path.read_bytes()
    assert len(data) == RECORD_BYTES * 4
    assert data[:RECORD_BYTES].rstrip() == f"pid {os.getpid()}: reaper scan".encode()
    assert data[RECORD_BYTES:] == b"x" * (RECORD_BYTES * 3)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (b"pid 7: reaper reap\n" + b" " * 100, "pid 7: reaper reap"),
        (b"pid 7: \x1b[2J\x1b]0;owned\x07reaper\r\nevil\x00", "pid 7: [2J ]0;owned reaper evil"),
        (b"\xff\xfe" + b"a" * 100_000, "\ufffd\ufffd" + "a" * 198),
        (b"", "a holder that left no record"),
    ],
)
def test_a_holders_record_is_read_as_bounded_printable_text(raw: bytes, shown: str) -> None:
    assert holder_text(raw) == shown
