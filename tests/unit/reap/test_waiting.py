"""The `waiting` verdict (reaper.reap.waiting) and what it does to the metrics: an orphan no DEL
can run for is reported apart, never as a leak the reaper will reclaim."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from reaper.kinds import cache
from reaper.kinds.netconf import parse_network_config
from reaper.metrics import ReaperMetrics
from reaper.model import (
    Attachment,
    AttachmentKey,
    NodeSnapshot,
    NsKey,
    RuntimeAnswer,
    RuntimeView,
    Sandbox,
    ScanReport,
    ScanResult,
)
from reaper.reap.waiting import mark_waiting
from reaper.scan import scan_pass
from reaper.settings import Settings
from reaper.state import KeptState
from tests.harness import results, snapshots
from tests.harness.reclaim_fakes import FakeLiveness
from tests.harness.scratch import scratch_settings

LOG = logging.getLogger("test")

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


ENDPOINT = "unix:///run/containerd/containerd.sock"
POD = ("default", "web-1")


def _calico_node(work: Path, cid: str) -> Settings:
    """A scratch node whose conf dir runs Calico and whose cache holds an entry of `cid` alone,
    its pin gone, naming the pod POD as a CRI runtime's entry does."""
    settings = scratch_settings(work)
    (work / "conf" / f"10-{NET}.conflist").write_text(json.dumps(CALICO))
    results_dir = work / "cache" / "results"
    results_dir.mkdir()
    doc = {"kind": "cniCacheV1", "containerId": cid, "networkName": NET, "ifName": "eth0", "result": RESULT,
           "config": base64.b64encode(json.dumps(CALICO).encode()).decode(),
           "cniArgs": [["K8S_POD_NAMESPACE", POD[0]], ["K8S_POD_NAME", POD[1]]]}  # fmt: skip
    (results_dir / f"{NET}-{cid}-eth0").write_text(json.dumps(doc))
    return settings


def _listing(*ids: str, reachable: bool = True) -> RuntimeView:
    """The node's one runtime, listing the sandboxes `ids` of POD (no creation time, as some
    runtimes answer), or unanswered."""
    answer = RuntimeAnswer(endpoint=ENDPOINT, source="--runtime-endpoint", name="containerd", version="2",
                           reachable=reachable, error=None if reachable else "refused", sandboxes=len(ids))  # fmt: skip
    sandboxes = tuple(
        Sandbox(
            id=i,
            name=POD[1],
            namespace=POD[0],
            uid="u",
            ready=True,
            created_at=None,
            netns_path=None,
            netns=None,
            runtime=ENDPOINT,
        )
        for i in ids
    )
    return RuntimeView(endpoint=ENDPOINT, name="containerd", version="2", reachable=reachable,
                       error=None if reachable else "refused", sandboxes=sandboxes if reachable else (),
                       runtimes=(answer,))  # fmt: skip


def _verdict(result: ScanResult, cid: str) -> str:
    (found,) = [a.verdict for a in result.report.attachments if a.key.container_id == cid]
    return found


def test_the_agent_frees_a_calico_leftover_of_a_sandbox_its_runtime_listed_and_no_more(tmp_path: Path) -> None:
    """Before: `waiting` for good. The agent (one KeptState across passes) saw the sandbox listed
    on its first pass; on the next no runtime lists it: an orphan its DEL will be run for."""
    cid = "c" * 64
    settings = _calico_node(tmp_path, cid)
    kept = KeptState()
    liveness = FakeLiveness(_listing(cid), _listing())
    assert _verdict(scan_pass(settings, liveness, LOG, kept=kept), cid) == "live"
    second = scan_pass(settings, liveness, LOG, kept=kept)
    assert _verdict(second, cid) == "orphan" and second.gone_here == {cid: POD}


def test_a_calico_leftover_waits_where_no_runtime_was_seen_to_list_it(tmp_path: Path) -> None:
    """A one-shot run (no memory), an agent that never saw the ID listed (a forged entry naming
    another node's pod), an agent whose runtime is unanswered, and one whose only word for the ID
    is the state file's (which whoever writes the state dir can write): each waits."""
    cid = "c" * 64
    settings = _calico_node(tmp_path, cid)
    one_shot = FakeLiveness(_listing(cid), _listing())
    scan_pass(settings, one_shot, LOG)
    assert _verdict(scan_pass(settings, one_shot, LOG), cid) == "waiting"
    # The state file the one-shots wrote names the ID (first seen, its attachment's history).
    assert cid in Path(settings.state_file).read_text()
    from_file = KeptState()
    result = scan_pass(settings, FakeLiveness(_listing()), LOG, kept=from_file)
    assert _verdict(result, cid) == "waiting" and result.gone_here == {}
    never = KeptState()
    other = FakeLiveness(_listing("d" * 64), _listing())
    scan_pass(settings, other, LOG, kept=never)
    assert _verdict(scan_pass(settings, other, LOG, kept=never), cid) == "waiting"
    down = KeptState()
    unanswered = FakeLiveness(_listing(cid), _listing(reachable=False), _listing())
    scan_pass(settings, unanswered, LOG, kept=down)
    assert _verdict(scan_pass(settings, unanswered, LOG, kept=down), cid) == "unknown"
    # Answered again: the listing remembered before the outage still proves it.
    assert _verdict(scan_pass(settings, unanswered, LOG, kept=down), cid) == "orphan"


def test_orphans_that_hold_a_namespace_are_marked_without_weighing_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an orphan with no namespace, all of whose records a DEL needs, can wait: when no
    orphan is such, the report stands as it is and the node's trust is never built."""
    snapshot, report = _node(tmp_path, {"a" * 64: KINDNET}, CILIUM)
    held = replace(report, attachments=tuple(replace(a, netns=NsKey(1, 2)) for a in report.attachments))

    def weighed(*args: object, **kwargs: object) -> None:
        raise AssertionError("the node's trust was built")

    monkeypatch.setattr("reaper.reap.waiting.orphan_trust", weighed)
    assert mark_waiting(held, snapshot) is held
    with pytest.raises(AssertionError, match="trust was built"):  # one that can wait: weighed
        mark_waiting(report, snapshot)
