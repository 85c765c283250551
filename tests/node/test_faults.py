"""Faults: broken plugins, a runtime that is down, restarted or listing nothing, a corrupt state
file, a full disk. Each ends with nothing live lost, a clear log line or metric, and the next
pass working."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.state import STATE_VERSION
from tests.harness.agent import LabAgent, metric
from tests.harness.lab import Lab
from tests.harness.lab.kernel import mount as kernel_mount
from tests.harness.lab.kernel import umount
from tests.harness.plugins import crash, garbage, script
from tests.harness.reap_helpers import (
    HANG_PLUGIN,
    REAP,
    SCAN,
    leak_left,
    pings,
    racing_reap,
    rewrite_cached_config,
)
from tests.harness.reaper_cli import attachments_by_key, run_reaper

# Both seed sandboxes beside the live pod, as the runtime keeps them, in every test here.
pytestmark = pytest.mark.usefixtures("seeds")


@pytest.mark.parametrize(
    ("plugin", "script", "error"), [("crash", script(crash), "exit -11"), ("garbage", script(garbage), "")]
)
def test_a_crashing_or_babbling_plugin(
    lab: Lab, web: str, tmp_path: Path, plugin: str, script: str, error: str
) -> None:
    path = lab.bin_dir / f"reaper-{plugin}"
    path.write_text(script)
    path.chmod(0o755)
    leak = lab.make_leak(with_cache=True)
    rewrite_cached_config(leak, [*lab.network_spec.plugins("normal"), {"type": f"reaper-{plugin}"}])
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--allow-plugin", f"reaper-{plugin}")
    # Its DEL failed (the garbage plugin exits 0 on DEL but prints no JSON): a plugin not known
    # to be stateless keeps what its DEL needs, and the rest is freed.
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr
    (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == leak.container_id]
    assert outcome["needs_plugin"] == f"reaper-{plugin}"
    assert any(f"reaper-{plugin}" in e for e in outcome["plugin_errors"])
    assert f"lease {leak.ip}" not in leak_left(lab, leak)
    assert "Traceback" not in run.stderr and pings(lab, web)
    rewrite_cached_config(leak, lab.network_spec.plugins("normal"))
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0 and leak_left(lab, leak) == []


def test_the_runtime_listing_nothing_opens_the_breaker(
    lab: Lab, web: str, seeds: tuple[str, str], tmp_path: Path
) -> None:
    chained, nocni = seeds
    leak = lab.make_leak(with_cache=True)
    doc = racing_reap(lab, "empty", [], tmp_path / "state.json", SCAN)  # the default ratio, 0.5
    # The runtime's own NOTREADY sandboxes look orphaned when it lists nothing: with the leak, 3 of
    # 5 attachments. The breaker holds; only web's pods stay live, through the process inside.
    assert doc["breaker"]["open"] is True and doc["reclaimed"] == []
    got = attachments_by_key(doc)
    assert got[(web, lab.network_name, "eth0")]["verdict"] == "live"
    assert "inside its netns" in got[(web, lab.network_name, "eth0")]["reason"]
    assert len(leak_left(lab, leak)) == 5
    pins = {p.name for p in lab.netns_dir.iterdir()}
    for sandbox in (chained, nocni):
        pin = lab.pod_netns_path(sandbox)
        assert pin is not None and pin.name in pins
    assert pings(lab, web)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)  # the runtime as it is
    assert run.returncode == 0 and leak_left(lab, leak) == []


def test_a_runtime_restarting_under_the_agent(lab: Lab, web: str, seeds: tuple[str, str], tmp_path: Path) -> None:
    chained, nocni = seeds
    agent = LabAgent(
        lab, tmp_path / "state.json", "--mode", "reap", "--interval", "1s", "--runtime-timeout", "2s", *REAP
    )
    try:
        agent.wait_for("/readyz", 200)
        for _ in range(3):
            lab.stop_runtime()
            time.sleep(1.5)
            lab.start_runtime()
            time.sleep(1.5)
        agent.wait_for("/readyz", 200, timeout=30)
        body = agent.get("/metrics")[1]
        assert metric(body, "cni_reaper_runtime_up") == 1
        assert metric(body, "cni_reaper_passes_total", outcome="error") == 0
    finally:
        assert agent.stop() == 0
    sandboxes = {s.id for s in lab.sandboxes()}
    assert {chained, nocni, web} <= sandboxes
    for sandbox in (chained, nocni, web):
        pin = lab.pod_netns_path(sandbox)
        assert pin is not None and pin.exists()
    assert pings(lab, web)
    reclaimed = [line for line in agent.log_lines() if line["msg"] == "reclaimed"]
    assert reclaimed == [], "nothing of the runtime's was reclaimed while it restarted"


def test_a_corrupt_or_missing_state_file(lab: Lab, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_bytes(b'{"version": 2, "attachments": {"x": "not a list"')
    run = run_reaper(lab, "scan", state, "--json", *SCAN)
    assert run.returncode == 0
    assert any("is corrupt" in line and "starting afresh" in line for line in run.stderr.splitlines())
    assert json.loads(state.read_text())["version"] == STATE_VERSION, "rewritten whole"
    assert (tmp_path / "state.json.corrupt").read_bytes().startswith(b'{"version": 2, "attachments": {"x"')
    state.unlink()
    run = run_reaper(lab, "scan", state, "--json", *SCAN)
    # A missing file is no warning (the --min-age 0 this lab runs with is one, said each run).
    assert run.returncode == 0 and "state file" not in run.stderr and state.exists()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs of the test's own, filled up."""
    mount = tmp_path / "full"
    mount.mkdir()
    kernel_mount("tmpfs", str(mount), "tmpfs", 0, "size=64k")
    try:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # full
        finally:
            os.close(fd)
        yield mount
    finally:
        umount(str(mount), 2)


def test_a_full_disk_for_the_state_and_the_textfile(lab: Lab, web: str, full_disk: Path, tmp_path: Path) -> None:
    leak = lab.make_leak(with_cache=True)
    state, textfile = full_disk / "state.json", tmp_path / "cni_reaper.prom"
    run = run_reaper(lab, "reap", state, "--json", *REAP, "--textfile", str(textfile))
    # The pass itself is not stopped by the disk: it reclaims, and says what it could not write.
    assert run.returncode == 0, run.stderr
    assert leak_left(lab, leak) == []
    assert any("cannot write state file" in line and "No space left" in line for line in run.stderr.splitlines())
    assert metric(textfile.read_text(), "cni_reaper_state_write_errors_total") == 1
    full_textfile = full_disk / "cni_reaper.prom"
    run = run_reaper(lab, "scan", tmp_path / "state.json", *SCAN, "--textfile", str(full_textfile))
    assert run.returncode == 0
    assert any("textfile not written" in line for line in run.stderr.splitlines())
    # No temp file left behind; the one-reaper lock (an empty file: no room for its record) stays.
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "state.json.lock"]
    (full_disk / "filler").unlink()
    run = run_reaper(lab, "reap", state, "--json", *REAP, "--textfile", str(full_textfile))
    assert run.returncode == 0 and state.exists() and full_textfile.exists()
    assert metric(full_textfile.read_text(), "cni_reaper_state_write_errors_total") == 0
    assert pings(lab, web)


def test_sigterm_while_a_plugin_hangs_stops_within_seconds(lab: Lab, web: str, tmp_path: Path) -> None:
    plugin = lab.bin_dir / "reaper-hang"
    plugin.write_text(HANG_PLUGIN)
    plugin.chmod(0o755)
    leak = lab.make_leak(with_cache=True)
    rewrite_cached_config(leak, [*lab.network_spec.plugins("normal"), {"type": "reaper-hang"}])
    flags = ("--mode", "reap", "--interval", "60s", "--plugin-timeout", "10m", "--allow-plugin", "reaper-hang")
    agent = LabAgent(lab, tmp_path / "state.json", *flags, *REAP)
    try:
        deadline = time.monotonic() + 30
        # By its path: the agent's own command line names the plugin's type (--allow-plugin).
        while not _running(str(plugin)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _running(str(plugin)), "the agent's DEL is under way"
        # The plugin's own timeout is 10 minutes: a stop that waited for it would be killed at
        # LabAgent.stop's 20 s and not exit 0. The DEL's error says the stop killed it.
        assert agent.stop() == 0
    finally:
        agent.stop()
    assert not _running("reaper-hang"), "the plugin and its child were killed"
    del_errors = [str(line.get("error")) for line in agent.log_lines() if line["msg"] == "plugin DEL failed"]
    assert any("stopping, killed" in error for error in del_errors), del_errors
    assert any(line["msg"] == "agent stopped" for line in agent.log_lines())
    # Nothing was left half-done that the next pass cannot finish, once its DEL can succeed.
    rewrite_cached_config(leak, lab.network_spec.plugins("normal"))
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0 and leak_left(lab, leak) == []
    assert pings(lab, web)


def _running(text: str) -> bool:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    return True
            except OSError:
                continue
    return False
