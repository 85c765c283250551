"""`reaper explain` and the pass plan each attachment with the same functions
(reaper.reap.requests.orphan_trust and plan_orphan), so what explain says a reclaim would run is
the entry plan_pass makes for it. Before: explain weighed the node's trust with its attachment
alone (another orphan's address counted as held by one in use) and ignored --method kernel."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper.explain import explain
from reaper.kinds import cache
from reaper.kinds.netconf import parse_network_config
from reaper.model import Policy
from reaper.reap import run
from reaper.reap.waiting import mark_waiting
from tests.harness.configs import cache_doc
from tests.harness.passes import confirmed
from tests.harness.reclaim_fakes import FakeLiveness, fake_settings, reap_settings, scan_result
from tests.harness.snapshots import cid, runtime, snapshot

NET = "k8s-pod-network"
CILIUM = {"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "cilium-cni"}]}
# Two dead containers' entries naming one address (a reused IP): neither is in use.
RESULT = {"cniVersion": "1.0.0", "ips": [{"address": "192.168.7.9/32"}]}


@pytest.mark.parametrize("kernel_only", [False, True])
def test_explain_says_what_the_plan_step_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_only: bool
) -> None:
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    for n in (1, 2):
        doc = cache_doc(cid(n), NET, config=CILIUM, result=RESULT, cniArgs=[["K8S_POD_NAME", f"gone-{n}"]])
        (results / f"{NET}-{cid(n)}-eth0").write_text(json.dumps(doc))
    entries = tuple(replace(e, mtime=0.0) for e in cache.collect_cache(str(tmp_path / "cache"), {NET}).entries)
    own = parse_network_config(json.dumps(CILIUM).encode(), f"/etc/cni/net.d/10-{NET}.conflist")
    snap = replace(snapshot(caches=entries), configs=(own,))
    report = confirmed(snap, Policy(min_age=0.0, confirmations=1, stuck_after=900.0), snap.taken_at)
    scanned = scan_result(mark_waiting(report, snap, plugins_run=not kernel_only), snap)
    monkeypatch.setattr(run, "scan_pass", lambda *_a, **_k: scanned)
    base = reap_settings(dry_run=True)
    reap = replace(base, policy=replace(base.policy, kernel_only=kernel_only))
    planned = run.plan_pass(fake_settings(tmp_path), reap, FakeLiveness(runtime()), logging.getLogger("test"))
    entries_by_key = {p.key: p for p in planned.plan}
    skipped = {s.key: s.reason for s in planned.skipped}
    assert len(scanned.report.attachments) == 2
    for attachment in scanned.report.attachments:
        (evidence,) = explain(scanned, attachment.key.container_id or "", {}, 1, kernel_only=kernel_only)
        entry = entries_by_key.get(attachment.key)
        assert evidence.planned == entry
        if entry is None:
            assert evidence.reclaim == (f"nothing this pass: {skipped[attachment.key]}",)
            continue
        said = evidence.reclaim[0]
        assert said.startswith(f"DEL with the config from {entry.config_source}:") == (entry.config_source is not None)
    # Both plan the DEL a runtime runs once the netns is gone; --method kernel, none.
    assert len(entries_by_key) == (0 if kernel_only else 2)
    assert all(p.config_source is not None for p in planned.plan)
