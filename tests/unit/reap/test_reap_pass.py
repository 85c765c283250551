"""reap_pass end to end over a fake node: the scan is faked (its report is the test's), the rest
of the pass runs as it does on a node. The runtime undecided, no orphans, the breaker, --max-reap,
the dry-run plan, the stop flag, and a runtime lost at a re-check."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from reaper.host.quarantine import Quarantine
from reaper.logs import JsonFormatter, TextFormatter
from reaper.model import Attachment, ReapResult, RuntimeView, SkippedAttachment
from reaper.reap import reap_pass, run
from reaper.reap.act import UNREACHABLE_AT_RECHECK
from reaper.reap.plan import Planned
from reaper.reap.review import NodeIdentity, PlanFile, plan_document, read_plan
from tests.harness.reclaim_fakes import (
    FAKE_LAST,
    FakeLiveness,
    FakeNode,
    fake_settings,
    reap_settings,
    report_of,
    scan_result,
)
from tests.harness.snapshots import cid, runtime, sandbox

LOG = logging.getLogger("test")


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    """A fake node: its kinds are the pass's (node.registry), and every look of the pass is of it."""
    fake = FakeNode()
    monkeypatch.setattr(run, "take_snapshot", lambda *_a, **_k: fake.look())
    return fake


class Pass:
    """A reap pass over `node` whose scan reports `attachments` as the runtime `scanned` saw them."""

    def __init__(self, node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.node = node
        self.monkeypatch = monkeypatch
        self.settings = fake_settings(tmp_path)
        self.scans = 0

    def __call__(
        self,
        *attachments: Attachment,
        views: tuple[RuntimeView, ...] = (runtime(),),
        scanned: RuntimeView | None = None,
        stop: threading.Event | None = None,
        reviewed: PlanFile | None = None,
        **reap: Any,
    ) -> ReapResult:
        report = report_of(scanned or runtime(), *attachments)
        snap = self.node.look()

        def scan(*_args: Any, **_kwargs: Any) -> Any:
            self.scans += 1
            return scan_result(report, snap)

        self.monkeypatch.setattr(run, "scan_pass", scan)
        liveness = FakeLiveness(*views)
        return reap_pass(
            self.settings, reap_settings(**reap), liveness, LOG, stop=stop, reviewed=reviewed,
            registry=self.node.registry,
        )  # fmt: skip

    def plan(self, *attachments: Attachment, **reap: Any) -> Planned:
        """The plan step alone (run.plan_pass) over the same scan as a pass."""
        report = report_of(runtime(), *attachments)
        snap = self.node.look()
        self.monkeypatch.setattr(run, "scan_pass", lambda *_a, **_k: scan_result(report, snap))
        return run.plan_pass(
            self.settings, reap_settings(**reap), FakeLiveness(runtime()), LOG, registry=self.node.registry
        )


@pytest.fixture
def reap(node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Pass:
    return Pass(node, monkeypatch, tmp_path)


def orphans(node: FakeNode, *ns: int) -> list[Attachment]:
    return [node.attachment(n, node.add(f"res-{n}"), node.add(f"last-{n}", FAKE_LAST)) for n in ns]


def live(node: FakeNode, *ns: int) -> list[Attachment]:
    return [node.attachment(n, node.add(f"live-{n}"), verdict="live") for n in ns]


def test_an_unreachable_runtime_makes_the_pass_undecided_and_touches_nothing(reap: Pass, node: FakeNode) -> None:
    found = orphans(node, 1)
    result = reap(*found, scanned=runtime(reachable=False))
    assert result.outcome == "undecided" and "runtime unreachable" in str(result.problem)
    assert result.plan == () and result.reclaimed == ()
    assert len(node.records) == 2 and node.looks == 1  # only the test's own look


def test_a_pass_without_orphans_plans_nothing(reap: Pass, node: FakeNode) -> None:
    result = reap(*live(node, 1, 2))
    assert result.outcome == "ok" and result.problem is None
    assert result.plan == () and result.reclaimed == () and result.skipped == ()


def test_orphans_are_reclaimed_and_live_attachments_stay(reap: Pass, node: FakeNode) -> None:
    result = reap(*orphans(node, 1), *live(node, 2, 3, 4))
    assert result.outcome == "ok"
    assert [o.ok for o in result.reclaimed] == [True]
    assert {r.name for r in node.records.values()} == {"live-2", "live-3", "live-4"}
    assert [s.method for p in result.plan for s in p.steps] == ["kernel", "kernel"]
    assert {name for name, _ in result.timings} >= {"scan", "recheck", "verify"}


def test_the_breaker_refuses_a_pass_where_most_attachments_look_orphaned(reap: Pass, node: FakeNode) -> None:
    result = reap(*orphans(node, 1, 2, 3), *live(node, 4), max_orphan_ratio=0.5)
    assert result.breaker_open and result.outcome == "breaker"
    assert result.breaker_reason is not None and "3 of 4" in result.breaker_reason
    assert "breaker open" in str(result.problem)
    assert result.reclaimed == () and len(node.records) == 7


def test_force_overrides_the_breaker(reap: Pass, node: FakeNode) -> None:
    result = reap(*orphans(node, 1, 2, 3), *live(node, 4), max_orphan_ratio=0.5, force=True)
    assert not result.breaker_open
    assert len(result.reclaimed) == 3 and all(o.ok for o in result.reclaimed)


def test_max_reap_takes_that_many_and_defers_the_rest(reap: Pass, node: FakeNode) -> None:
    one, two, three = orphans(node, 1, 2, 3)
    result = reap(one, two, three, *live(node, 4, 5, 6, 7), max_reap=2)
    assert [o.key for o in result.reclaimed] == [one.key, two.key]
    assert [(s.key, s.reason) for s in result.skipped] == [(three.key, "over --max-reap 2; next pass")]
    assert {r.name for r in node.records.values() if r.name.endswith("-3")} == {"res-3", "last-3"}


def test_a_dry_run_plans_and_changes_nothing(reap: Pass, node: FakeNode) -> None:
    found = orphans(node, 1, 2)
    looks_before = node.looks
    result = reap(*found, *live(node, 3, 4, 5), dry_run=True)
    assert [p.key for p in result.plan] == [a.key for a in found]
    assert all(p.config_source is None for p in result.plan), "no kernel object proves a fake attachment"
    assert all(p.config_note is not None for p in result.plan)
    assert [(s.kind, s.method) for s in result.plan[0].steps] == [("fake", "kernel"), (FAKE_LAST, "kernel")]
    assert result.reclaimed == () and len(node.records) == 7
    assert node.looks == looks_before + 1, "no look but the scan's"


def test_a_stop_before_acting_skips_every_selected_orphan(reap: Pass, node: FakeNode) -> None:
    stop = threading.Event()
    stop.set()
    found = orphans(node, 1, 2)
    result = reap(*found, *live(node, 3, 4, 5), stop=stop)
    assert {(s.key, s.reason) for s in result.skipped} == {(a.key, "stopping") for a in found}
    assert len(result.plan) == 2 and result.reclaimed == ()
    assert len(node.records) == 7


def test_a_runtime_unreachable_at_the_first_recheck_leaves_everything(reap: Pass, node: FakeNode) -> None:
    found = orphans(node, 1)
    result = reap(*found, *live(node, 2, 3), views=(runtime(reachable=False),))
    assert result.outcome == "undecided" and result.recheck_error == "connection refused"
    assert [s.reason for s in result.skipped] == [UNREACHABLE_AT_RECHECK]
    assert len(node.records) == 4


def test_a_runtime_lost_during_the_pass_makes_it_undecided(reap: Pass, node: FakeNode) -> None:
    found = orphans(node, 1)
    # The pass's first re-check sees the runtime; the one right before the attachment's step does not.
    result = reap(*found, *live(node, 2, 3), views=(runtime(), runtime(reachable=False)))
    assert result.outcome == "undecided" and result.recheck_error == "connection refused"
    assert result.reclaimed == ()
    assert result.skipped[0].reason.startswith(UNREACHABLE_AT_RECHECK)


def test_an_orphan_whose_sandbox_reappears_at_the_recheck_is_left(reap: Pass, node: FakeNode) -> None:
    one, two = orphans(node, 1, 2)
    result = reap(one, two, *live(node, 3, 4, 5), views=(runtime(sandbox(1)),))
    assert [(s.key, s.reason) for s in result.skipped] == [(one.key, "its sandbox is listed again")]
    assert [o.key for o in result.reclaimed] == [two.key]
    assert result.outcome == "ok"


NODE = NodeIdentity("node-a", "boot-1")


def reviewed_plan(result: ReapResult, tmp_path: Path) -> PlanFile:
    """What --plan-out writes for `result`, read back as --plan reads it."""
    path = tmp_path / "plan.json"
    path.write_bytes(plan_document(result.plan, result.report.attachments, NODE, 0.0))
    return read_plan(str(path), NODE)


def test_a_reviewed_plan_reclaims_only_what_it_names_as_it_was(reap: Pass, node: FakeNode, tmp_path: Path) -> None:
    one, two, three = orphans(node, 1, 2, 3)
    dry = reap(one, two, *live(node, 4, 5, 6, 7), dry_run=True)
    plan = reviewed_plan(dry, tmp_path)
    assert [len(a.resources) for a in plan.attachments] == [2, 2]
    # Since the review: the second orphan's sandbox came back, a third orphan appeared.
    result = reap(one, node.attachment(2, *two.resources, verdict="live"), three, *live(node, 4, 5, 6, 7),
                  reviewed=plan)  # fmt: skip
    assert [o.key for o in result.reclaimed] == [one.key]
    reasons = {s.key: s.reason for s in result.skipped}
    assert reasons[three.key] == "not in the reviewed plan"
    assert reasons[two.key].startswith("in the reviewed plan, but live now")
    assert {r.name for r in node.records.values()} >= {"res-2", "last-2", "res-3", "last-3"}


def test_an_orphan_whose_resources_or_steps_changed_is_not_reclaimed(
    reap: Pass, node: FakeNode, tmp_path: Path
) -> None:
    one, two = orphans(node, 1, 2)
    plan = reviewed_plan(reap(one, two, *live(node, 3, 4, 5, 6), dry_run=True), tmp_path)
    grown = node.attachment(1, *one.resources, node.add("more-1"))
    result = reap(grown, two, *live(node, 3, 4, 5, 6), reviewed=plan)
    reasons = {s.key: s.reason for s in result.skipped}
    assert reasons[one.key].startswith("its resources changed since the plan: 1 new")
    assert [o.key for o in result.reclaimed] == [two.key]
    assert "more-1" in {r.name for r in node.records.values()}


def test_every_reclaim_line_names_the_pod_network_container_and_method(
    reap: Pass, node: FakeNode, caplog: pytest.LogCaptureFixture
) -> None:
    # The pod as reconcile reads it from the attachment's cache entry (reaper.kinds.cache.ref).
    podded = replace(node.attachment(1, node.add("res-1"), node.add("last-1", FAKE_LAST)), pod="shop/cart-7f9c")
    bare = node.attachment(2, node.add("res-2"), network="other-net")  # podman's: no pod in its args
    node.leave["res-2"] = "EBUSY"
    with caplog.at_level(logging.INFO, logger=LOG.name):
        reap(podded, bare, *live(node, 3, 4, 5))
    lines = {
        vars(r)["container_id"]: r for r in caplog.records if r.getMessage() in ("reclaimed", "reclaim incomplete")
    }
    assert set(lines) == {cid(1), cid(2)}
    one, two = lines[cid(1)], lines[cid(2)]
    assert one.getMessage() == "reclaimed" and two.getMessage() == "reclaim incomplete"
    fields = {
        "pod_namespace": "shop",
        "pod_name": "cart-7f9c",
        "network": "mynet",
        "ifname": "eth0",
        "method": "kernel",
    }
    assert fields.items() <= vars(one).items()
    assert {"network": "other-net", "method": "kernel"}.items() <= vars(two).items()
    assert "pod_namespace" not in vars(two) and "pod_name" not in vars(two)
    # Both log formats carry them: JSON as fields, text as key=value.
    doc = json.loads(JsonFormatter().format(one))
    assert doc["msg"] == "reclaimed"
    expected = {"container_id": cid(1), "network": "mynet", "pod_namespace": "shop", "pod_name": "cart-7f9c"}
    assert expected.items() <= doc.items() and doc["method"] == "kernel"
    text = TextFormatter().format(one)
    assert text.startswith("info: reclaimed ")
    for field in (
        "pod_namespace=shop",
        "pod_name=cart-7f9c",
        "network=mynet",
        f"container_id={cid(1)}",
        "method=kernel",
    ):
        assert f" {field}" in text, field


def test_a_dry_run_leaves_out_of_its_plan_what_the_address_check_would_leave(
    reap: Pass, node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = orphans(node, 1, 2)
    why = "its address 10.0.0.2 is configured in the netns of pid 4242, not its own: a live pod holds it"
    monkeypatch.setattr(run, "addresses_in_use", lambda selected, *_a, **_k: {two.key: why} if two in selected else {})
    result = reap(one, two, *live(node, 3, 4, 5, 6), dry_run=True)
    assert [p.key for p in result.plan] == [one.key]
    assert [(s.key, s.reason) for s in result.skipped] == [(two.key, why)]
    assert len(node.records) == 8, "a dry run changes nothing"


def test_a_pass_starts_by_expiring_the_quarantine_and_a_dry_run_does_not(reap: Pass, tmp_path: Path) -> None:
    """--quarantine-max-age: at the start of a reclaiming pass (nothing to reclaim, even), what
    was quarantined longer ago goes; a --dry-run changes nothing, so it deletes nothing either."""
    root = tmp_path / "quarantine"
    now = 1_800_000_000.0
    old = Path(Quarantine(str(root), now=now - 8 * 86400).destination("/var/lib/cni/networks/n/10.0.0.7"))
    old.parent.mkdir(parents=True)
    old.write_text("c1")
    young = Path(Quarantine(str(root), now=now - 3600).destination("/var/lib/cni/networks/n/10.0.0.8"))
    young.parent.mkdir(parents=True)
    young.write_text("c2")
    plain = reap_settings()
    policy = replace(plain.policy, quarantine_dir=str(root))
    settings = replace(plain, policy=policy, quarantine_max_age=7 * 86400.0)
    reap.monkeypatch.setattr(run, "scan_pass", lambda *_a, **_k: scan_result(report_of(runtime()), reap.node.look()))

    reap_pass(reap.settings, replace(settings, dry_run=True), FakeLiveness(runtime()), LOG, clock=lambda: now)
    assert old.exists()
    reap_pass(reap.settings, settings, FakeLiveness(runtime()), LOG, clock=lambda: now)
    assert not old.exists() and young.read_text() == "c2"


def test_the_dry_run_shows_the_plan_the_act_step_then_acts_on(reap: Pass, node: FakeNode) -> None:
    """One plan (run.plan_pass): a dry run shows it, --plan-out writes it, and the act step
    handed it acts on those orphans and no others."""
    one, two, three = found = orphans(node, 1, 2, 3)
    others = live(node, 4, 5, 6, 7)
    planned = reap.plan(*found, *others, max_reap=2, dry_run=True)
    shown = reap(*found, *others, max_reap=2, dry_run=True)
    assert shown.plan == run.preview(planned, reap.settings).plan == planned.plan
    assert shown.skipped == planned.skipped == (SkippedAttachment(three.key, "over --max-reap 2; next pass"),)
    assert len(node.records) == 10, "neither the dry run nor the plan step touched anything"
    acted = run.act_on(planned, reap.settings, reap_settings(max_reap=2), FakeLiveness(runtime()), LOG)
    assert [o.key for o in acted.reclaimed] == [p.key for p in shown.plan] == [one.key, two.key]
    assert all(o.ok for o in acted.reclaimed) and acted.plan == shown.plan
    assert {r.name for r in node.records.values() if not r.name.startswith("live-")} == {"res-3", "last-3"}


def test_the_kinds_a_pass_is_given_reach_its_plan_and_its_reclaim_order(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The registry handed to reap_pass is the one every step reads: a kind registered first but
    marked `last` and quarantinable is planned to the quarantine (the plan) and reclaimed after
    the rest (the reclaim order), as the node's cache entry is."""
    files = replace(next(k for k in node.kinds if k.name == FAKE_LAST), quarantinable=True)
    node.use((files, *(k for k in node.kinds if k.name != FAKE_LAST)))
    (found,) = orphans(node, 1)
    snap = node.look()
    monkeypatch.setattr(run, "scan_pass", lambda *_a, **_k: scan_result(report_of(runtime(), found), snap))
    plain = reap_settings(force=True)  # one orphan of one attachment: past the breaker
    settings = replace(plain, policy=replace(plain.policy, quarantine_dir=str(tmp_path / "quarantine")))
    result = reap_pass(fake_settings(tmp_path), settings, FakeLiveness(runtime()), LOG, registry=node.registry)
    assert [(s.kind, s.method) for s in result.plan[0].steps] == [("fake", "kernel"), (FAKE_LAST, "quarantine")]
    assert node.batches == [["res-1"], ["last-1"]], "the last kind goes after the rest"
    assert result.reclaimed[0].ok and node.records == {}
