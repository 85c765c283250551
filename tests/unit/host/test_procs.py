"""Whether every process on the node can be seen, judged from /proc."""

from __future__ import annotations

import os
from pathlib import Path

from reaper.host.procs import unseen_processes


def test_a_proc_of_another_pid_namespace_is_told_apart(tmp_path: Path) -> None:
    (tmp_path / "self").symlink_to(str(os.getpid() + 100_000))  # /proc/self names another pid
    assert "another PID namespace" in str(unseen_processes(str(tmp_path)))
    assert "cannot be read" in str(unseen_processes(str(tmp_path / "missing")))


def test_a_proc_of_a_pid_namespace_other_than_the_hosts(tmp_path: Path) -> None:
    (tmp_path / str(os.getpid()) / "ns").mkdir(parents=True)
    (tmp_path / str(os.getpid()) / "ns" / "pid").touch()  # not the initial PID namespace's inode
    (tmp_path / "self").symlink_to(str(os.getpid()))
    assert "host's PID namespace" in str(unseen_processes(str(tmp_path)))
