"""CRI-O's other pins (`<namespaces_dir>/{ipc,uts,user,pid}ns/<uuid>`) on real namespaces, in a
lab: `reaper reap` reclaims them with the orphan netns pin of their name, keeps one a process is
inside, reports one with no netns pin beside it, and touches no mount outside the lab."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from reaper.host.files import namespace_of
from tests.harness.lab import Lab
from tests.harness.lab.kernel import umount
from tests.harness.reap_helpers import REAP
from tests.harness.reaper_cli import run_reaper

MNT_DETACH = 2
# A user namespace cannot be bind-mounted here (EPERM): its pins are covered by the unit tests.
FLAGS = {"ipc": ["--ipc"], "uts": ["--uts"], "pid": ["--fork", "--pid"]}


def pin_other(namespaces_dir: Path, ns_type: str, name: str) -> Path:
    """A fresh namespace of `ns_type` pinned at `<namespaces_dir>/<type>ns/<name>`, as pinns does."""
    directory = namespaces_dir / f"{ns_type}ns"
    directory.mkdir(exist_ok=True)
    path = directory / name
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444))
    *flags, last = FLAGS[ns_type]
    try:
        subprocess.run(["unshare", *flags, f"{last}={path}", "true"], check=True, timeout=30)
    except (subprocess.SubprocessError, OSError):
        path.unlink()
        raise
    return path


def is_mount_point(path: Path) -> bool:
    return any(line.split(" ")[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def mounts_outside_labs() -> set[str]:
    """Every mount point of this mount namespace that no lab made (other labs may be running)."""
    points = (line.split(" ")[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return {p for p in points if "reaperlab-" not in p}


def hold(pin: Path) -> subprocess.Popen[bytes]:
    """A process inside the ipc namespace behind `pin`, which no runtime lists."""
    holder = subprocess.Popen(["nsenter", f"--ipc={pin}", "sleep", "120"])
    for _ in range(200):
        if namespace_of(f"/proc/{holder.pid}/ns/ipc") == namespace_of(str(pin)):
            return holder
        time.sleep(0.02)
    holder.kill()
    raise AssertionError("the holder never entered the namespace")


def outcomes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for attachment in doc["reclaimed"] for r in attachment["resources"] if r["kind"] == "nspins"}


def test_crio_pins_go_with_their_netns_pin_and_one_in_use_or_alone_stays(lab: Lab, tmp_path: Path) -> None:
    namespaces_dir = lab.netns_dir.parent
    gone, held, alone = (str(uuid.uuid4()) for _ in range(3))
    made: list[Path] = []
    holder: subprocess.Popen[bytes] | None = None
    before = mounts_outside_labs()
    try:
        made += [lab.make_pin(gone), lab.make_pin(held)]
        made += [pin_other(namespaces_dir, t, gone) for t in FLAGS]
        made += [pin_other(namespaces_dir, "ipc", held), pin_other(namespaces_dir, "uts", alone)]
        holder = hold(namespaces_dir / "ipcns" / held)

        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--namespaces-dir", str(namespaces_dir))
        assert run.returncode == 1, run.stderr  # incomplete: the held pin stays
        done = outcomes(run.doc)

        for ns_type in FLAGS:
            path = namespaces_dir / f"{ns_type}ns" / gone
            assert not path.exists() and done[f"{ns_type}ns/{gone}"]["ok"], done
        assert not (lab.netns_dir / gone).exists() and not (lab.netns_dir / held).exists()

        kept = namespaces_dir / "ipcns" / held
        assert kept.exists() and is_mount_point(kept)
        assert not done[f"ipcns/{held}"]["ok"] and "in use" in done[f"ipcns/{held}"]["error"]

        lonely = namespaces_dir / "utsns" / alone
        assert lonely.exists() and is_mount_point(lonely) and f"utsns/{alone}" not in done
        why = [u["why"] for u in run.doc["unconfirmed"] if u["name"] == f"utsns/{alone}"]
        assert why and "no netns pin beside it" in why[0]

        assert before <= mounts_outside_labs()  # the reaper unmounted nothing of the host's
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        for path in made:
            with contextlib.suppress(OSError):
                umount(str(path), MNT_DETACH)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
