"""Exclusions and reviewed plans on a real containerd with live pods and real leaks (the
plugins' own ADD left them): what the operator keeps out is never touched, and a plan replayed
after the node changed acts only on what is still as it was reviewed."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.lab import Lab
from tests.harness.reap_helpers import REAP, leak_left, pings, racing_reap, seeded_lab
from tests.harness.reaper_cli import attachments_by_key, run_reaper

# A live pod beside the ones each test starts.
pytestmark = pytest.mark.usefixtures("web")


def key(lab: Lab, cid: str) -> tuple[str, str, str]:
    return (cid, lab.network_name, "eth0")


def test_an_excluded_namespace_pod_and_network_are_never_reclaimed(lab: Lab, tmp_path: Path) -> None:
    web = lab.run_pod("web2")
    system = lab.make_leak(pod_namespace="kube-system", pod_name="coredns-0")
    named = lab.make_leak(pod_namespace="monitoring", pod_name="prometheus-0")
    plain = lab.make_leak(pod_namespace="default", pod_name="job-1")
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP,
                     "--exclude-namespace", "kube-*", "--exclude-pod", "monitoring/prom*")  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    found = attachments_by_key(run.doc)
    assert found[key(lab, system.container_id)]["verdict"] == "excluded"
    assert found[key(lab, system.container_id)]["pod"] == "kube-system/coredns-0"
    assert "--exclude-namespace kube-*" in found[key(lab, system.container_id)]["reason"]
    assert found[key(lab, named.container_id)]["verdict"] == "excluded"
    assert leak_left(lab, system) and leak_left(lab, named), "excluded leaks keep every resource"
    assert len(leak_left(lab, system)) == 5 and len(leak_left(lab, named)) == 5
    assert leak_left(lab, plain) == []
    assert run.doc["summary"]["excluded"] == 2
    # A network exclusion keeps all of that network, whatever the pod.
    again = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--exclude-network", lab.network_name)
    assert again.returncode == 0 and again.doc["reclaimed"] == []
    assert {
        a["verdict"] for a in again.doc["attachments"] if a["container_id"] in (system.container_id, named.container_id)
    } == {"excluded"}
    # Without the exclusions they are leaks like any other.
    last = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert last.returncode == 0, last.stdout[-2000:] + last.stderr
    assert leak_left(lab, system) == [] and leak_left(lab, named) == []
    assert pings(lab, web)


def test_a_plan_replayed_after_the_node_changed_acts_only_on_what_is_as_reviewed(lab: Lab, tmp_path: Path) -> None:
    web = lab.run_pod("web3")
    kept = lab.make_leak()
    entered = lab.make_leak()
    plan_file = tmp_path / "plan.json"
    dry = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--dry-run", "--plan-out", str(plan_file))
    assert dry.returncode == 1, dry.stdout[-2000:] + dry.stderr  # orphans planned
    assert oct(os.stat(plan_file).st_mode & 0o777) == "0o600"
    plan = json.loads(plan_file.read_text())
    planned = {a["container_id"] for a in plan["attachments"]}
    assert {kept.container_id, entered.container_id} <= planned
    # Since the review: a process entered one leak's netns (its container came back), and a new leak appeared.
    inside = subprocess.Popen(["nsenter", f"--net={entered.netns_path}", "sleep", "300"])
    late = lab.make_leak()
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--plan", str(plan_file))
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        assert leak_left(lab, kept) == []
        assert len(leak_left(lab, entered)) == 5, "entered since the review: live, kept whole"
        assert len(leak_left(lab, late)) == 5, "not reviewed: kept whole"
        reasons = {s["container_id"]: s["reason"] for s in run.doc["skipped"]}
        assert reasons[late.container_id] == "not in the reviewed plan"
        assert reasons[entered.container_id].startswith("in the reviewed plan, but live now")
    finally:
        inside.kill()
        inside.wait()
    # A plan that is not this node's reaper's (edited to name another node) is refused whole.
    plan["node"] = "elsewhere"
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(plan))
    refused = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--plan", str(forged))
    assert refused.returncode == 2 and "made on node 'elsewhere'" in refused.stderr
    assert len(leak_left(lab, late)) == 5
    # --plan-out outside --dry-run writes nothing and acts on nothing.
    wrong = run_reaper(lab, "reap", tmp_path / "state.json", *REAP, "--plan-out", str(tmp_path / "x.json"))
    assert wrong.returncode == 2 and "--dry-run" in wrong.stderr and not (tmp_path / "x.json").exists()
    assert len(leak_left(lab, late)) == 5 and pings(lab, web)
    cleanup = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert cleanup.returncode == 0 and leak_left(lab, late) == [] and leak_left(lab, entered) == []


def test_explain_shows_a_live_pod_and_a_leak_with_the_evidence(lab: Lab, tmp_path: Path) -> None:
    web = lab.run_pod("web4")
    leak = lab.make_leak(pod_namespace="shop", pod_name="cart-0")
    state = tmp_path / "state.json"
    assert run_reaper(lab, "scan", state, "--confirmations", "2", "--min-age", "0").returncode == 0  # pending: 1 of 2
    before = state.read_bytes()

    by_prefix = run_reaper(lab, "explain", state, web[:8], "--json", "--confirmations", "2", "--min-age", "0")
    assert by_prefix.returncode == 0, by_prefix.stdout[-2000:] + by_prefix.stderr
    live = [a for a in by_prefix.doc["attachments"] if a["network"] == lab.network_name]
    assert [a["verdict"] for a in live] == ["live"]
    assert any(f"sandbox {web[:12]}" in line and "READY" in line for line in live[0]["evidence"]["runtimes"])
    assert live[0]["evidence"]["reclaim"] == ["nothing: it is live"]

    # Seconds after the scan, a look is the same look: it would not count (half of --interval, 30s).
    soon = run_reaper(lab, "explain", state, "shop/cart-0", "--confirmations", "2", "--min-age", "0")
    assert "verdict: PENDING" in soon.stdout and "after the last counted one, counts only" in soon.stdout
    time.sleep(0.5)  # half of the 1s interval below, since the scan counted
    spaced = ("env", "REAPER_INTERVAL=1s")
    by_pod = run_reaper(lab, "explain", state, "shop/cart-0", "--confirmations", "2", "--min-age", "0", wrap=spaced)
    assert by_pod.returncode == 0, by_pod.stdout[-2000:] + by_pod.stderr
    text = by_pod.stdout
    assert f"attachment {leak.container_id}/{lab.network_name}/eth0 (pod shop/cart-0)" in text
    assert "verdict: ORPHAN" in text, "the second pass without an owner: the first was counted by scan"
    assert f"no runtime lists a sandbox {leak.container_id[:12]}" in text and "no process is inside it" in text
    assert "ownerless on 1 consecutive earlier passes (--confirmations 2)" in text
    assert f"DEL with the config from {leak.cache_path}" in text and "bridge" in text
    assert f"CNI_NETNS={leak.netns_path}" in text
    by_ip = run_reaper(lab, "explain", state, leak.ip, "--json")
    by_veth = run_reaper(lab, "explain", state, leak.host_veth, "--json")
    by_pin = run_reaper(lab, "explain", state, leak.netns_path.name, "--json")
    for run in (by_ip, by_veth, by_pin):
        assert [a["container_id"] for a in run.doc["attachments"]] == [leak.container_id]
    assert state.read_bytes() == before, "explain counts no pass of its own"
    nothing = run_reaper(lab, "explain", state, "no-such-thing")
    assert nothing.returncode == 1 and "nothing on this node matches 'no-such-thing'" in nothing.stdout
    assert len(leak_left(lab, leak)) == 5 and pings(lab, web), "explain changes nothing"
    assert run_reaper(lab, "reap", state, "--json", *REAP).returncode == 0


def test_a_plan_made_while_the_runtime_forgot_sandboxes_is_not_acted_on_once_it_lists_them(tmp_path: Path) -> None:
    """The seed sandboxes (NOTREADY, nothing inside) hidden from every list of a dry run: their
    leftovers are planned as orphans. Replayed once the runtime lists them again, nothing of
    theirs is touched, and each is skipped with what the runtime says now."""
    with seeded_lab() as (lab, chained, nocni, web):
        plan_file = tmp_path / "plan.json"
        doc = racing_reap(lab, "hidden", [chained, nocni], tmp_path / "state.json",
                          (*REAP, "--dry-run", "--plan-out", str(plan_file)))  # fmt: skip
        planned = {a["container_id"] for a in json.loads(plan_file.read_text())["attachments"]}
        assert chained in planned and chained in {p["container_id"] for p in doc["plan"]}
        pins = {p.name for p in lab.netns_dir.iterdir()}
        leases = sorted(p.name for p in (lab.ipam_dir / lab.network_name).iterdir())
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--plan", str(plan_file))
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        assert run.doc["reclaimed"] == []
        reasons = {s["container_id"]: s["reason"] for s in run.doc["skipped"]}
        assert reasons[chained].startswith(f"in the reviewed plan, but live now: sandbox {chained[:12]} is listed")
        assert {p.name for p in lab.netns_dir.iterdir()} == pins
        assert sorted(p.name for p in (lab.ipam_dir / lab.network_name).iterdir()) == leases
        assert pings(lab, web)
