"""Plugins that keep state of their own: the reaper never drops the only record their DEL needs.

Debian ships no plugin with a datastore of its own (cilium-cni, aws-cni, kindnet, calico), so
`reaper-datastore` below stands in for one, written to the code path those plugins share: ADD
records the attachment in its datastore (a file per container here, a database there) and has no
`ipam` key; DEL removes that record, but returns success without touching anything when
CNI_NETNS is empty, as kindnet's DEL does; STATUS (CNI 1.1) answers code 50 while its datastore is
not ready. A live pod on the lab's own network checks that nothing of it is touched.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.plugins import datastore, script
from tests.harness.reap_helpers import REAP, leak_left, pings
from tests.harness.reaper_cli import ReaperRun, run_reaper

PLUGIN = "reaper-datastore"


@dataclass
class World:
    lab: Lab
    live: str  # a pod on the lab's own network
    network: str  # the datastore plugin's network
    conflist: dict[str, Any]
    store: Path
    calls: Path


@pytest.fixture(scope="module")
def world(lab: Lab) -> World:
    lab.install_plugin(PLUGIN, script(datastore))
    store = lab.bin_dir / "datastore"
    store.mkdir()
    network = f"store-{secrets.token_hex(3)}"
    conflist: dict[str, Any] = {"cniVersion": "1.1.0", "name": network, "plugins": [{"type": PLUGIN}]}
    (lab.conf_dir / "20-store.conflist").write_text(json.dumps(conflist))
    live = lab.run_pod("live")
    return World(lab, live, network, conflist, store, lab.bin_dir / "datastore-calls.jsonl")


@dataclass
class Attached:
    container_id: str
    pin: Path
    cache: Path
    record: Path


def attach(world: World) -> Attached:
    """ADD the datastore network for a container ID the runtime never saw, with its cache entry."""
    lab, cid = world.lab, secrets.token_hex(32)
    world.calls.unlink(missing_ok=True)  # each test reads the calls made since its attachment
    pin = lab.make_pin()
    call = lab.plugin_call(cid, pin)
    _, cache = labcni.add_and_cache(lab.cache_dir, world.conflist, call)
    record = world.store / cid
    assert record.exists()
    return Attached(cid, pin, cache, record)


def unpin(pin: Path) -> None:
    subprocess.run(["umount", str(pin)], check=True)
    pin.unlink()


def calls(world: World, cid: str) -> list[dict[str, Any]]:
    if not world.calls.exists():
        return []
    return [c for c in map(json.loads, world.calls.read_text().splitlines()) if c["id"] in (cid, None)]


def outcome_of(run: ReaperRun, cid: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [o for o in run.doc["reclaimed"] if o["container_id"] == cid]
    assert len(found) == 1, run.doc["reclaimed"]
    return found[0]


def reap(world: World, tmp_path: Path) -> ReaperRun:
    return run_reaper(world.lab, "reap", tmp_path / f"state-{secrets.token_hex(3)}.json", "--json", *REAP)


@contextlib.contextmanager
def flag(world: World, name: str) -> Iterator[None]:
    path = world.store / name
    path.touch()
    try:
        yield
    finally:
        path.unlink()


def assert_live_untouched(world: World) -> None:
    assert pings(world.lab, world.live), "the live pod no longer answers"


def test_its_del_gets_the_pin_as_the_runtime_would_and_then_the_entry_goes(world: World, tmp_path: Path) -> None:
    leak = attach(world)
    run = reap(world, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    (del_call,) = [c for c in calls(world, leak.container_id) if c["command"] == "DEL"]
    assert del_call["netns"] == str(leak.pin)
    assert not leak.record.exists() and not leak.cache.exists() and not leak.pin.exists()
    assert outcome_of(run, leak.container_id)["needs_plugin"] is None
    assert_live_untouched(world)


def test_without_its_pin_no_del_runs_and_the_only_record_is_kept(world: World, tmp_path: Path) -> None:
    """Before: DEL ran with an empty CNI_NETNS, the plugin answered success having freed nothing,
    and the cache entry, the only record of what its DEL needs, was removed: the datastore's
    record leaked for good. Now it is kept, reported, and takes no place under --max-reap."""
    leak = attach(world)
    unpin(leak.pin)
    others = [world.lab.make_leak(with_cache=True) for _ in range(2)]
    run = run_reaper(world.lab, "reap", tmp_path / "state.json", "--json", *REAP, "--max-reap", "2")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert [c for c in calls(world, leak.container_id) if c["command"] == "DEL"] == []
    assert leak.record.exists() and leak.cache.exists()
    (waiting,) = [s for s in run.doc["skipped"] if s["container_id"] == leak.container_id]
    assert waiting["reason"].startswith("waits:") and PLUGIN in waiting["reason"]
    # The two leaks that can be reclaimed are, though --max-reap is 2.
    assert {o["container_id"] for o in run.doc["reclaimed"]} == {o.container_id for o in others}
    assert all(leak_left(world.lab, o) == [] for o in others)
    leak.cache.unlink()
    leak.record.unlink()
    assert_live_untouched(world)


def test_a_failed_del_keeps_what_the_next_del_needs_and_the_next_pass_frees_it(world: World, tmp_path: Path) -> None:
    leak = attach(world)
    with flag(world, "fail-del"):
        run = reap(world, tmp_path)
        assert run.returncode == 1, run.stdout[-2000:] + run.stderr
        outcome = outcome_of(run, leak.container_id)
        assert outcome["needs_plugin"] == PLUGIN and any("try later" in e for e in outcome["plugin_errors"])
        # The pin is what DEL gets as CNI_NETNS, and the cache entry what it runs: both stay.
        assert leak.record.exists() and leak.cache.exists() and leak.pin.exists()
    run = reap(world, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert not leak.record.exists() and not leak.cache.exists() and not leak.pin.exists()
    assert_live_untouched(world)


def test_a_plugin_whose_status_says_not_available_gets_no_del_and_nothing_is_freed(
    world: World, tmp_path: Path
) -> None:
    leak = attach(world)
    with flag(world, "not-ready"):
        run = reap(world, tmp_path)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        (skipped,) = [s for s in run.doc["skipped"] if s["container_id"] == leak.container_id]
        assert "STATUS" in skipped["reason"] and "datastore not ready" in skipped["reason"]
        assert [c["command"] for c in calls(world, leak.container_id)] == ["ADD", "STATUS"]
        assert leak.record.exists() and leak.cache.exists() and leak.pin.exists()
    run = reap(world, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert [c["command"] for c in calls(world, leak.container_id)][-2:] == ["STATUS", "DEL"]
    assert not leak.record.exists() and not leak.cache.exists() and not leak.pin.exists()
    assert_live_untouched(world)
