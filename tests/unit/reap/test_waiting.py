"""The `waiting` verdict (reaper.reap.waiting) and what it does to the metrics: an orphan no DEL
can run for is reported apart, never as a leak the reaper will reclaim."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from reaper.kinds import cache
from reaper.kinds.netconf import parse_network_config
from reaper.metrics import ReaperMetrics
from reaper.model import Attachment, AttachmentKey, NodeSnapshot, ScanReport
from reaper.reap.waiting import mark_waiting
from tests.harness import results, snapshots

NET = "k8s-pod-network"
RESULT = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/cni-1"}]}
CALICO = {"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "calico", "ipam": {"type": "calico-ipam"}}]}
CILIUM = {"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "cilium-cni"}]}
KINDNET = {"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "ptp"}, {"type": "kindnet"}]}


def _node(tmp: Path, chains: dict[str, dict[str, Any]], conf: dict[str, Any]) -> tuple[NodeSnapshot, ScanReport]:
    """Cache entries alone (their pins gone) of each container ID in `chains`, each an orphan, on
    a node whose conf dir holds `conf`."""
    results_dir = tmp / "cache" / "results"
    results_dir.mkdir(parents=True)
    for cid, config in chains.items():
        doc = {"kind": "cniCacheV1", "containerId": cid, "networkName": NET, "ifName": "eth0", "result": RESULT}
        doc["config"] = base64.b64encode(json.dumps(config).encode()).decode()
        (results_dir / f"{NET}-{cid}-eth0").write_text(json.dumps(doc))
    entries = cache.collect_cache(str(tmp / "cache"), {NET}).entries
    own = parse_network_config(json.dumps(conf).encode(), f"/etc/cni/net.d/10-{NET}.conflist")
    snapshot = replace(snapshots.snapshot(caches=tuple(entries)), configs=(own,))
    attachments = tuple(
        Attachment(
            key=AttachmentKey(e.container_id, NET, "eth0"),
            resources=(replace(cache.ref(e), identity=cache.identity(e)),),
            netns=None,
            verdict="orphan",
            reason="no sandbox and no process own it, on 2 consecutive passes",
            age_seconds=90_000.0,
        )
        for e in entries
    )
    report = replace(results.full_report(), attachments=attachments, ranges=())
    return snapshot, report


def _verdicts(report: ScanReport) -> dict[str, tuple[str, str]]:
    return {str(a.key.container_id): (a.verdict, a.reason) for a in report.attachments}


def test_an_orphan_no_del_can_run_for_is_waiting_and_one_that_gets_its_del_stays_an_orphan(tmp_path: Path) -> None:
    kindnet, cilium = "a" * 64, "b" * 64
    snapshot, report = _node(tmp_path, {kindnet: KINDNET, cilium: CILIUM}, CILIUM)
    marked = _verdicts(mark_waiting(report, snapshot))
    assert marked[cilium][0] == "orphan"
    verdict, reason = marked[kindnet]
    assert verdict == "waiting" and reason.startswith("waits:") and "kindnet" in reason
    (waiting,) = [a for a in mark_waiting(report, snapshot).attachments if a.verdict == "waiting"]
    assert waiting.waits_for == ("kindnet",)
    # --method kernel: no DEL runs, so the cilium entry waits too.
    assert _verdicts(mark_waiting(report, snapshot, plugins_run=False))[cilium][0] == "waiting"


def test_a_calico_orphan_with_no_pin_waits(tmp_path: Path) -> None:
    """Calico frees by container ID in the cluster's datastore (reaper.kinds.netconf)."""
    calico = "c" * 64
    snapshot, report = _node(tmp_path, {calico: CALICO}, CALICO)
    verdict, reason = _verdicts(mark_waiting(report, snapshot))[calico]
    assert verdict == "waiting" and "calico" in reason


def test_waiting_is_no_orphan_to_the_leak_metrics_and_has_a_bounded_gauge_of_its_own(tmp_path: Path) -> None:
    chains = {"a" * 64: KINDNET, "b" * 64: CALICO, "c" * 64: {**KINDNET, "plugins": [{"type": "x" * 300}]}}
    snapshot, report = _node(tmp_path, chains, CALICO)
    metrics = ReaperMetrics(mode="scan")
    metrics.observe_scan(mark_waiting(report, snapshot, plugins_run=False))
    value = metrics.registry.get_sample_value
    assert value("cni_reaper_attachments", {"verdict": "waiting"}) == 3
    assert value("cni_reaper_attachments", {"verdict": "orphan"}) == 0
    assert value("cni_reaper_resources", {"kind": "cache", "verdict": "waiting"}) == 3
    # A waiting attachment is files alone: no series for a pair that cannot occur.
    assert value("cni_reaper_resources", {"kind": "veth", "verdict": "waiting"}) is None
    assert value("cni_reaper_oldest_orphan_age_seconds", {"kind": "cache"}) == 0
    assert value("cni_reaper_waiting_attachments", {"plugin": "kindnet"}) == 1
    assert value("cni_reaper_waiting_attachments", {"plugin": "calico"}) == 1
    assert value("cni_reaper_waiting_attachments", {"plugin": "_other"}) == 1  # a made-up name
    metrics.observe_scan(report)  # none waits: no series left behind
    assert value("cni_reaper_waiting_attachments", {"plugin": "kindnet"}) is None
