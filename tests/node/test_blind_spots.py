"""Fail closed where the node cannot be seen: a /proc of another PID namespace, a mount
namespace that netns mounts do not propagate to. Nothing whose owner could be hiding there is
reclaimed, and the report says why."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from reaper.host.files import namespace_of
from tests.harness.lab import Lab
from tests.harness.reap_helpers import REAP, leak_left, pings
from tests.harness.reaper_cli import attachments_by_key, run_reaper

PRIVATE_PROC = ("unshare", "--pid", "--fork", "--mount-proc")
PRIVATE_MOUNTS = ("unshare", "--mount", "--propagation", "private")


def hold(pin: Path) -> subprocess.Popen[bytes]:
    """A process inside the netns behind `pin` that no runtime lists (a debugger, a podman
    container, a runtime's ADD in progress)."""
    holder = subprocess.Popen(["nsenter", f"--net={pin}", "sleep", "120"])
    for _ in range(200):
        if namespace_of(f"/proc/{holder.pid}/ns/net") == namespace_of(str(pin)):
            return holder
        time.sleep(0.02)
    holder.kill()
    raise AssertionError("the holder never entered the namespace")


def test_without_the_hosts_pid_namespace_nothing_with_a_netns_is_an_orphan(lab: Lab, web: str, tmp_path: Path) -> None:
    leak = lab.make_leak(with_cache=True)
    holder = hold(leak.netns_path)
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, wrap=PRIVATE_PROC)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        held = attachments_by_key(run.doc)[(leak.container_id, leak.network, leak.ifname)]
        assert held["verdict"] == "unknown" and "PID namespace" in held["reason"]
        assert leak.netns_path.exists() and run.doc["reclaimed"] == [] and pings(lab, web)
    finally:
        holder.kill()
        holder.wait()
    # Seen from the host's PID namespace, once nobody is inside, it is an ordinary leak.
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0 and leak_left(lab, leak) == []


def test_where_netns_mounts_do_not_propagate_no_pin_is_unlinked(lab: Lab, web: str, tmp_path: Path) -> None:
    leak = lab.make_leak(with_cache=True)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, wrap=PRIVATE_MOUNTS)
    (outcome,) = run.doc["reclaimed"]
    pin = next(r for r in outcome["resources"] if r["kind"] == "netns")
    assert not pin["ok"] and "do not propagate" in pin["error"]
    assert leak.netns_path.exists() and pings(lab, web)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)  # from the host's mounts
    assert run.returncode == 0 and leak_left(lab, leak) == []
