"""The kernel facts the mount walk's first-line shortcut (reaper.host.nsmounts._Heads) rests
on, on a real kernel: a task in the mount namespace a held mountinfo names shows its first
line; a task in a copy of it (unshare -m) does not, as a copy's mounts get IDs of their own."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from reaper.host import nsmounts


@pytest.fixture
def sleepers() -> Iterator[tuple[int, int]]:
    """(pid in this mount namespace, pid in a private copy of it), both stopped by their pid."""
    same = subprocess.Popen(["sleep", "120"])
    copy = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "120"])
    try:
        # unshare execs sleep in the new namespace: wait until the pid shows it.
        own = os.stat("/proc/self/ns/mnt").st_ino
        for _ in range(200):
            if os.stat(f"/proc/{copy.pid}/ns/mnt").st_ino != own:
                break
            time.sleep(0.01)
        yield same.pid, copy.pid
    finally:
        for child in (same, copy):
            child.kill()
            child.wait()


def test_a_first_line_tells_a_task_of_the_held_namespace_from_one_of_a_copy(
    sleepers: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nsmounts, "HEAD_MIN_BYTES", 0)
    same, copy = sleepers
    assert os.stat(f"/proc/{copy}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino
    heads = nsmounts._Heads()
    try:
        text, fd = nsmounts._read_open("/proc/self/mountinfo")
        assert heads.keep(text, fd)
        assert heads.in_one_read(f"/proc/{same}")
        assert not heads.in_one_read(f"/proc/{copy}")
    finally:
        heads.close()
