"""Who made a namespace, asked of a real kernel: root's namespaces (in the host's user namespace
or in one root made) name no user; uid 65534's, made with `unshare -Ur` (nested or not), name
it; a mount namespace is asked through a process in it, and only while that process is."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from reaper.host.userns import Owners, mount_namespace_owners, owners_of

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def _in(argv: list[str], processes: list[subprocess.Popen[bytes]]) -> int:
    """The pid of `sleep` run at the end of `argv`, once it runs (its namespaces made)."""
    proc = subprocess.Popen([*argv, "sh", "-c", "echo ready; exec sleep 60"], stdout=subprocess.PIPE)
    processes.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc.pid


def _owners(pid: int, kind: str = "net") -> Owners:
    fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return owners_of(fd)
    finally:
        os.close(fd)


def test_each_namespace_names_the_users_that_made_it(processes: list[subprocess.Popen[bytes]]) -> None:
    roots = _in(["unshare", "-n"], processes)
    roots_in_a_userns = _in(["unshare", "-U", "-n"], processes)
    nobodys = _in([*NOBODY, "unshare", "-Urn"], processes)
    nested = _in([*NOBODY, "unshare", "-Ur", "unshare", "-Urn"], processes)
    assert _owners(os.getpid()) == Owners(())
    assert _owners(roots) == Owners(()) and _owners(roots).user is None
    assert _owners(roots_in_a_userns) == Owners((0,)) and _owners(roots_in_a_userns).user is None
    assert _owners(nobodys) == Owners((65534,)) and _owners(nobodys).user == 65534
    assert _owners(nested) == Owners((65534, 65534)) and _owners(nested).user == 65534


def test_a_mount_namespace_is_asked_through_a_process_only_while_it_is_in_it(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    nobodys = _in([*NOBODY, "unshare", "-Urm"], processes)
    mount_ns = os.stat(f"/proc/{nobodys}/ns/mnt").st_ino
    owners = mount_namespace_owners(nobodys, mount_ns)
    assert owners is not None and owners.user == 65534
    mine = os.stat("/proc/self/ns/mnt").st_ino
    assert mount_namespace_owners(os.getpid(), mine) == Owners(())
    assert mount_namespace_owners(os.getpid(), mount_ns) is None, "another mount namespace is there"
    processes[-1].kill()
    processes[-1].wait()
    assert mount_namespace_owners(nobodys, mount_ns) is None, "gone"
    assert mount_namespace_owners(0, mount_ns) is None, "no process"
