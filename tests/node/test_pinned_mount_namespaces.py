"""Mount namespaces with no process in them, pinned by whoever can make a user namespace
(issue 31, points 1 and 2B), on a real kernel, made as uid 65534 the way the red-team did.

Before: to read such a namespace the reaper ran `nsenter --mount=... -- /proc/self/fd/M`, and
nsenter resolved that program inside the namespace, whose `/proc` its maker chose: a plain
`reaper scan` ran the user's program as root. And one pinned where no walk reaches (a tmpfs over
its dir; binfmt_misc, which the walk did not go through) made the walk fail, every namespace
busy, and nothing with a netns decided again, for as long as the user kept it.

Now a child of the reaper joins the namespace and runs nothing; its mountinfo is read from
outside. The user's namespace is still read (the netns mounted there is held); one the user
made unreachable is left out and named; the same made by root still fails the walk.

On a shared machine other reapers (older checkouts) walk these namespaces too, and the old
ones run the planted program: each test counts only the runs its own reaper made (the TAG of
tests.harness.users_pins, set in its environment)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reaper.host.nsmounts import NO_PROCESS, held_mounts, mount_held
from reaper.host.procs import EveryNamespaceBusy
from tests.harness.probe import probe_argv
from tests.harness.probes import walk_after_grpc
from tests.harness.users_pins import TAG, PinnedByUser, pinned_by_user

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tag(monkeypatch: pytest.MonkeyPatch) -> str:
    """This test's mark in the environment its reaper runs with (this process, its scans): a
    planted program run by this test's reaper writes it, one run by any other reaper on the
    machine does not."""
    value = secrets.token_hex(8)
    monkeypatch.setenv(TAG, value)
    return value


def scan(empty: Path) -> tuple[int, dict[str, Any]]:
    """`reaper scan --json` with every dir an empty one of its own and no runtime answering."""
    dirs = {name: empty / name for name in ("netns", "ipam", "cache", "conf", "bin")}
    for path in dirs.values():
        path.mkdir(exist_ok=True)
    argv = [
        sys.executable, "-m", "reaper", "scan", "--json",
        "--netns-dir", str(dirs["netns"]), "--ipam-dir", str(dirs["ipam"]),
        "--cni-cache-dir", str(dirs["cache"]), "--cni-conf-dir", str(dirs["conf"]),
        "--cni-bin-dir", str(dirs["bin"]), "--runtime-endpoint", f"unix://{empty}/none.sock",
        "--state-file", str(empty / "state"),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    doc: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, doc


def held_there(pinned: PinnedByUser) -> list[tuple[int, int, str]]:
    walk = held_mounts(())  # no netns dir: every mount holds
    return [
        (m.pid, m.mount_ns, m.mount_point) for ns, found in walk.held.items() if ns.ino == pinned.netns for m in found
    ]


def test_a_program_planted_in_a_users_pinned_mount_namespace_is_never_run(tmp_path: Path, tag: str) -> None:
    with pinned_by_user("plain") as pinned:
        code, doc = scan(tmp_path)
        assert pinned.runs(tag) == [], "the planted program ran as root"
        assert code == 2 and doc["errors"] == [], doc["errors"]  # undecided only for want of a runtime
        # The namespace is still read, as the kernel shows it: the user's netns mounted there
        # is held, by a mount in that namespace with no process in it.
        assert held_there(pinned) == [(NO_PROCESS, pinned.mount_ns, pinned.net_pin)]
        held = mount_held((str(tmp_path / "netns"),))
        assert not isinstance(held, EveryNamespaceBusy), held
        assert any(ns.ino == pinned.netns for ns in held)
        assert pinned.runs(tag) == []


def test_a_users_pinned_mount_namespace_no_walk_reaches_leaves_the_other_namespaces_decided(
    tmp_path: Path, tag: str
) -> None:
    with pinned_by_user("shadow") as pinned:
        walk = held_mounts(())
        assert any(f"mnt:[{pinned.mount_ns}]" in why for why in walk.unread), walk.unread
        assert not isinstance(mount_held((str(tmp_path / "netns"),)), EveryNamespaceBusy)
        _, doc = scan(tmp_path)
        assert doc["errors"] == [], doc["errors"]
        assert pinned.runs(tag) == []


@pytest.mark.skipif(tuple(map(int, os.uname().release.split(".")[:2])) < (6, 7), reason="binfmt_misc in a userns: 6.7+")
def test_a_users_mount_namespace_pinned_on_binfmt_misc_is_read(tmp_path: Path, tag: str) -> None:
    with pinned_by_user("binfmt") as pinned:
        assert held_there(pinned) == [(NO_PROCESS, pinned.mount_ns, pinned.net_pin)]
        assert held_mounts(()).unread == ()
        assert pinned.runs(tag) == []


def test_the_same_made_by_root_still_fails_the_walk_closed(tmp_path: Path) -> None:
    with pinned_by_user("shadow", as_root=True) as pinned:
        with pytest.raises(OSError, match=f"mnt:\\[{pinned.mount_ns}\\].*cannot be reached"):
            held_mounts(())
        assert isinstance(mount_held((str(tmp_path / "netns"),)), EveryNamespaceBusy)
        _, doc = scan(tmp_path)
        assert [e["source"] for e in doc["errors"]] == ["heldns"], doc["errors"]


def test_a_pinned_mount_namespace_is_read_after_the_reaper_has_asked_a_runtime(tmp_path: Path, tag: str) -> None:
    """gRPC's fork handler starts a thread in each child forked after a runtime call, and the
    kernel refuses to move a child that shares its filesystem context into a mount namespace:
    every pass of the agent after its first runtime call could read no pinned one."""
    with pinned_by_user("plain") as pinned:
        argv = probe_argv(walk_after_grpc, str(tmp_path / "cri.sock"), str(pinned.netns))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
        out = json.loads(done.stdout)
        assert out["child_threads"] > 1, "gRPC's fork handler started no thread: the case is not made"
        assert out["unread"] == [], out["unread"]
        assert out["mounts"] == [[NO_PROCESS, pinned.mount_ns, pinned.net_pin]]
        assert pinned.runs(tag) == []
