"""Leftovers of plugins that free by container ID on this node get the DEL runtimes give them
when the netns is gone: CNI_NETNS empty, the cached result as prevResult, the config the node
vouches for. Calico frees by container ID in the cluster's datastore, where an ID no runtime of
this node lists may be another node's live pod: its leftovers wait in a one-shot run, and get
that DEL from the agent only for a sandbox the node's runtime listed to it (the last test).

Debian ships neither Calico nor Cilium, so `calico` and `cilium-cni` here are stand-ins written to
the DEL paths of the real plugins (tests/harness/plugins/by_container_id.py cites them): each
frees a per-container-ID record in a datastore dir of its own and succeeds with an empty
CNI_NETNS; while its `fail-del` flag exists it fails and frees nothing. `reaper-datastore` is
the kindnet-like plugin of test_stateful_plugins: success with no netns, having freed nothing.
A live pod on the lab's own network checks that nothing of it is touched.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.agent import LabAgent, metric
from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.plugins import by_container_id, datastore, script
from tests.harness.reap_helpers import REAP, SCAN, pings
from tests.harness.reaper_cli import ReaperRun, run_reaper

STANDINS = ("calico", "cilium-cni")
FREES_BY_ID = "cilium-cni"  # on this node: the one on reaper.kinds.netconf.FREES_WITHOUT_NETNS
KINDNET_LIKE = "reaper-datastore"


@dataclass
class World:
    lab: Lab
    live: str  # a pod on the lab's own network
    conflists: dict[str, dict[str, Any]]  # by plugin type: the network the conf dir holds for it


def _conflist(plugin: str) -> dict[str, Any]:
    network = f"{plugin}-{secrets.token_hex(3)}"
    first: dict[str, Any] = {"type": plugin}
    if plugin == "calico":
        first["ipam"] = {"type": "calico-ipam"}
    return {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [first, {"type": "portmap", "capabilities": {"portMappings": True}}],
    }


@pytest.fixture(scope="module")
def world(lab: Lab) -> World:
    for plugin in STANDINS:
        lab.install_plugin(plugin, script(by_container_id))
    lab.install_plugin(KINDNET_LIKE, script(datastore))
    (lab.bin_dir / "datastore").mkdir()
    conflists = {}
    for n, plugin in enumerate((*STANDINS, KINDNET_LIKE)):
        conflists[plugin] = _conflist(plugin)
        (lab.conf_dir / f"{30 + n}-{plugin}.conflist").write_text(json.dumps(conflists[plugin]))
    return World(lab, lab.run_pod("live"), conflists)


@dataclass
class Leftover:
    container_id: str
    cache: Path
    record: Path
    result: dict[str, Any]


def store_of(world: World, plugin: str) -> Path:
    return world.lab.bin_dir / ("datastore" if plugin == KINDNET_LIKE else f"{plugin}-store")


def leftover(world: World, plugin: str, conflist: dict[str, Any] | None = None) -> Leftover:
    """ADD `plugin`'s network (or `conflist`) for a container ID no runtime lists, with its cache
    entry, then drop its pin: what a failed DEL of a runtime leaves."""
    lab, cid = world.lab, secrets.token_hex(32)
    pin = lab.make_pin()
    result, cache = labcni.add_and_cache(lab.cache_dir, conflist or world.conflists[plugin], lab.plugin_call(cid, pin))
    subprocess.run(["umount", str(pin)], check=True)
    pin.unlink()
    record = store_of(world, plugin) / cid
    assert record.exists() and cache.exists()
    return Leftover(cid, cache, record, result)


def dels(world: World, plugin: str, cid: str) -> list[dict[str, Any]]:
    calls = world.lab.bin_dir / ("datastore-calls.jsonl" if plugin == KINDNET_LIKE else f"{plugin}-calls.jsonl")
    if not calls.exists():
        return []
    return [c for c in map(json.loads, calls.read_text().splitlines()) if c["id"] == cid and c["command"] == "DEL"]


def reap(world: World, tmp_path: Path, *extra: str) -> ReaperRun:
    return run_reaper(world.lab, "reap", tmp_path / f"state-{secrets.token_hex(3)}.json", "--json", *REAP, *extra)


def skipped_reason(run: ReaperRun, cid: str) -> str:
    (found,) = [s["reason"] for s in run.doc["skipped"] if s["container_id"] == cid]
    return str(found)


@contextlib.contextmanager
def failing(world: World, plugin: str) -> Iterator[None]:
    flag = store_of(world, plugin) / "fail-del"
    flag.touch()
    try:
        yield
    finally:
        flag.unlink()


def forget(*leftovers: Leftover) -> None:
    """What a test leaves on purpose goes, so that the next test's pass does not see it."""
    for left in leftovers:
        left.cache.unlink(missing_ok=True)
        left.record.unlink(missing_ok=True)


def test_a_leftover_with_no_pin_gets_its_del_with_no_netns_and_then_its_entry_goes(
    world: World, tmp_path: Path
) -> None:
    """Before: `waits: ... no DEL runs without a netns pin`, for good, the entry and the
    datastore's record both kept."""
    plugin = FREES_BY_ID
    left = leftover(world, plugin)
    run = reap(world, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    (del_call,) = dels(world, plugin, left.container_id)
    assert del_call["netns"] == ""
    assert del_call["prev"]["interfaces"] == left.result["interfaces"]  # the cached result, as prevResult
    assert not left.record.exists() and not left.cache.exists()
    (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == left.container_id]
    assert outcome["needs_plugin"] is None and outcome["plugin_errors"] == []
    assert pings(world.lab, world.live)


def test_a_failed_del_keeps_the_entry_and_the_next_pass_frees_it(world: World, tmp_path: Path) -> None:
    left = leftover(world, FREES_BY_ID)
    with failing(world, FREES_BY_ID):
        run = reap(world, tmp_path)
        assert run.returncode == 1, run.stdout[-2000:] + run.stderr
        (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == left.container_id]
        assert outcome["needs_plugin"] == "cilium-cni"
        assert any("try later" in e for e in outcome["plugin_errors"])
        assert left.record.exists() and left.cache.exists()
    run = reap(world, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert len(dels(world, FREES_BY_ID, left.container_id)) == 2
    assert not left.record.exists() and not left.cache.exists()


def test_a_plugin_not_known_to_free_without_a_netns_still_waits(world: World, tmp_path: Path) -> None:
    """kindnet's DEL answers success with no netns having freed nothing: its entry, the only
    record of what its DEL needs, stays, and no DEL runs; so does Calico's, whose datastore is
    the cluster's; a Cilium leftover of the same pass is freed."""
    waiting, freed = leftover(world, KINDNET_LIKE), leftover(world, FREES_BY_ID)
    calico = leftover(world, "calico")
    scan = run_reaper(world.lab, "scan", tmp_path / "scan-state.json", "--json", *SCAN)
    verdicts = {a["container_id"]: a["verdict"] for a in scan.doc["attachments"]}
    # Its own verdict, not an orphan's: the leak alerts and the exit status leave it out.
    assert verdicts[waiting.container_id] == "waiting" and verdicts[freed.container_id] == "orphan"
    assert verdicts[calico.container_id] == "waiting"
    assert scan.doc["summary"]["waiting"] == 2
    run = reap(world, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert dels(world, KINDNET_LIKE, waiting.container_id) == []
    assert waiting.record.exists() and waiting.cache.exists()
    assert skipped_reason(run, waiting.container_id).startswith("waits:")
    assert dels(world, "calico", calico.container_id) == []
    assert calico.record.exists() and calico.cache.exists()
    assert skipped_reason(run, calico.container_id).startswith("waits:")
    assert not freed.record.exists() and not freed.cache.exists()
    forget(waiting, calico)


def test_a_chain_with_any_plugin_not_on_the_list_waits(world: World, tmp_path: Path) -> None:
    network = world.conflists[FREES_BY_ID]
    mixed = {**network, "plugins": [*network["plugins"], {"type": KINDNET_LIKE}]}
    # The conf dir vouches for the chain: only the kindnet-like plugin in it makes it wait.
    (world.lab.conf_dir / "40-mixed.conflist").write_text(json.dumps({**mixed, "name": "mixed"}))
    try:
        left = leftover(world, FREES_BY_ID, {**mixed, "name": "mixed"})
        freed = leftover(world, FREES_BY_ID)
        run = reap(world, tmp_path)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        assert not freed.record.exists() and not freed.cache.exists()
        assert dels(world, FREES_BY_ID, left.container_id) == []
        assert KINDNET_LIKE in skipped_reason(run, left.container_id)
        assert left.record.exists() and left.cache.exists()
    finally:
        (world.lab.conf_dir / "40-mixed.conflist").unlink()
    forget(left)
    (store_of(world, KINDNET_LIKE) / left.container_id).unlink()


def test_an_entry_whose_config_the_node_does_not_vouch_for_runs_nothing(world: World, tmp_path: Path) -> None:
    """A forged entry: its config steers the plugin somewhere the conf dir's config does not.
    No plugin runs for it (not the conf dir's config either: no kernel object proves it) and it
    stays; a true leftover of the same pass is freed."""
    network = world.conflists[FREES_BY_ID]
    first = {**network["plugins"][0], "kubeconfig": "/tmp/not-the-nodes-kubeconfig"}
    forged = leftover(world, FREES_BY_ID, {**network, "plugins": [first, *network["plugins"][1:]]})
    true = leftover(world, FREES_BY_ID)
    run = reap(world, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert dels(world, FREES_BY_ID, forged.container_id) == []
    assert forged.record.exists() and forged.cache.exists()
    assert "kubeconfig" in skipped_reason(run, forged.container_id)
    assert not true.record.exists() and not true.cache.exists()
    forget(forged)
    assert pings(world.lab, world.live)


def test_a_reviewed_plan_drops_a_waiting_entry_the_operator_names_and_nothing_else(
    world: World, tmp_path: Path
) -> None:
    """Once the plugin's own tools freed what a waiting entry records, the operator names it to
    a reviewed plan (`--drop-waiting`): its file goes as a file, no DEL runs. Not without the
    plan, not by the plan alone, and no other waiting entry."""
    named, other = leftover(world, KINDNET_LIKE), leftover(world, KINDNET_LIKE)
    lab, state, plan = world.lab, tmp_path / "state.json", tmp_path / "plan.json"
    drop = ("--drop-waiting", named.container_id)
    refused = run_reaper(lab, "reap", state, *REAP, *drop)
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1].startswith("reaper: --drop-waiting acts on")
    dry = run_reaper(lab, "reap", state, "--json", *REAP, "--dry-run", "--plan-out", str(plan), *drop)
    assert dry.returncode == 1, dry.stdout[-2000:] + dry.stderr
    (planned,) = [p for p in dry.doc["plan"] if p["container_id"] == named.container_id]
    assert planned["config"] is None and {s["method"] for s in planned["steps"]} == {"kernel"}
    assert other.container_id not in {p["container_id"] for p in dry.doc["plan"]}
    alone = run_reaper(lab, "reap", state, "--json", *REAP, "--plan", str(plan))
    assert alone.returncode == 0, alone.stdout[-2000:] + alone.stderr
    assert named.cache.exists(), "a plan file alone drops nothing"
    run = run_reaper(lab, "reap", state, "--json", *REAP, "--plan", str(plan), *drop)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert not named.cache.exists() and other.cache.exists()
    assert dels(world, KINDNET_LIKE, named.container_id) == []
    assert named.record.exists()  # the datastore's: the operator frees it with the plugin's tools
    forget(named, other)


def until(holds: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll `holds` until it does (the agent acts in its own passes); fail saying `what`."""
    deadline = time.monotonic() + timeout
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.2)


def test_the_agent_frees_a_calico_leftover_of_a_sandbox_its_runtime_listed_and_a_forged_one_waits(
    world: World, tmp_path: Path
) -> None:
    """Before: both waited for good. A sandbox the lab's runtime ran, with a Calico attachment
    (its cache entry naming the sandbox's pod, as a runtime writes it), listed to the agent on a
    pass; then the sandbox is removed, its pin with it, and the entry left, as after a DEL that
    failed. The agent's next passes run Calico's DEL with no netns: while that DEL fails, the
    entry and the datastore's record stay; once it succeeds, both go. A forged entry of a
    container ID the runtime never listed (another node's pod, for all this node knows) waits,
    counted by the waiting gauge, and no DEL runs for it."""
    lab = world.lab
    agent = LabAgent(lab, tmp_path / "state.json", "--mode", "reap", "--interval", "1s", *REAP)
    sandbox = ""
    forged = None
    try:
        agent.wait_for_metric("cni_reaper_passes_total", lambda n: n >= 1, outcome="ok")
        sandbox = lab.run_pod("calico-pod")
        netns = lab.pod_netns_path(sandbox)
        assert netns is not None
        pod_args = (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", "calico-pod"))
        call = lab.plugin_call(sandbox, netns, cni_args=pod_args)
        _, cache = labcni.add_and_cache(lab.cache_dir, world.conflists["calico"], call)
        record = store_of(world, "calico") / sandbox
        forged = leftover(world, "calico")
        # Two passes more: one of them began after the sandbox was running, and listed it.
        passes = metric(agent.get("/metrics")[1], "cni_reaper_passes_total", outcome="ok")
        agent.wait_for_metric("cni_reaper_passes_total", lambda n: n >= passes + 2, outcome="ok")
        assert record.exists() and cache.exists() and dels(world, "calico", sandbox) == []
        with failing(world, "calico"):
            lab.stop_pod(sandbox)
            lab.remove_pod(sandbox)
            assert not netns.exists() and cache.exists()
            until(lambda: len(dels(world, "calico", sandbox)) >= 1, "a DEL of the removed sandbox")
            assert record.exists() and cache.exists(), "a failed DEL loses no record"
        until(lambda: not cache.exists(), "the entry gone once its DEL succeeded")
        assert not record.exists()
        calls = dels(world, "calico", sandbox)
        assert {c["netns"] for c in calls} == {""} and len(calls) >= 2
        body = agent.wait_for_metric("cni_reaper_waiting_attachments", lambda n: n >= 1, plugin="calico")
        assert metric(body, "cni_reaper_waiting_attachments", plugin="calico") == 1
        assert dels(world, "calico", forged.container_id) == []
        assert forged.record.exists() and forged.cache.exists()
        assert pings(lab, world.live)
    finally:
        assert agent.stop() == 0
        if sandbox and sandbox in {s.id for s in lab.sandboxes()}:
            lab.stop_pod(sandbox)
            lab.remove_pod(sandbox)
        if forged is not None:
            forget(forged)
