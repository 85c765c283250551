"""Reclaimer.run with fake kinds, a scripted runtime and a fake plugin: the re-checks, the stop
flag, a kind that raises, records kept for a chain that keeps state elsewhere, CNI STATUS, and
the verify step's word on what is gone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper.cni.requests import DelRequest
from reaper.host import nsmounts
from reaper.host.procs import EveryNamespaceBusy
from reaper.model import Attachment, AttachmentKey, NodeSnapshot, ReclaimOutcome, ResourceOutcome, RuntimeView
from reaper.reap import act
from reaper.reap.act import UNREACHABLE_AT_RECHECK, Reclaimer
from reaper.reap.logfields import reclaim_log_fields
from tests.harness.clocks import ManualClock
from tests.harness.passes import bare_reclaimer
from tests.harness.reclaim_fakes import (
    FAKE_LAST,
    FakeLiveness,
    FakeNode,
    fake_plugin,
    plugin_config,
    request_for,
    verbs_run,
)
from tests.harness.snapshots import cid, runtime, sandbox


def reclaimer(node: FakeNode, *views: RuntimeView, bin_dirs: tuple[str, ...] = ()) -> Reclaimer:
    liveness = FakeLiveness(*(views or (runtime(),)))
    return bare_reclaimer(
        look=node.look, registry=node.registry, observe=lambda: liveness.observe({}), bin_dirs=bin_dirs
    )


def two_resources(node: FakeNode, n: int) -> Attachment:
    """Attachment n with a resource reclaimed in order and one reclaimed last."""
    return node.attachment(n, node.add(f"res-{n}"), node.add(f"last-{n}", FAKE_LAST))


def test_every_resource_is_freed_and_the_last_kind_goes_after_the_others(node: FakeNode) -> None:
    one, two = two_resources(node, 1), two_resources(node, 2)
    outcomes, skipped = reclaimer(node).run([one, two], {})
    assert skipped == []
    assert [o.ok for o in outcomes] == [True, True]
    assert {r.method for o in outcomes for r in o.resources} == {"kernel"}
    assert node.records == {}
    assert [sorted(b) for b in node.batches] == [["res-1", "res-2"], ["last-1", "last-2"]]
    assert set(node.contexts[1].done) == {("fake", "res-1"), ("fake", "res-2")}, "the last kind sees what went before"


def test_a_resource_the_kind_leaves_is_reported_and_keeps_the_last_kind(node: FakeNode) -> None:
    one, two = two_resources(node, 1), two_resources(node, 2)
    node.leave["res-1"] = "held by a process"
    outcomes, _ = reclaimer(node).run([one, two], {})
    by_name = {r.name: r for o in outcomes for r in o.resources}
    assert not outcomes[0].ok and outcomes[1].ok
    assert by_name["res-1"].error == "held by a process"
    assert by_name["last-1"].error is not None and "other resources of the attachment remain" in by_name["last-1"].error
    assert {r.name for r in node.records.values()} == {"res-1", "last-1"}


def test_a_kind_whose_reclaim_raises_fails_only_the_record_that_broke_it(node: FakeNode) -> None:
    one, two = two_resources(node, 1), two_resources(node, 2)
    node.raise_on.add("res-2")
    outcomes, _ = reclaimer(node).run([one, two], {})
    by_name = {r.name: r for o in outcomes for r in o.resources}
    assert by_name["res-1"].ok
    assert not by_name["res-2"].ok
    assert by_name["res-2"].error is not None and "failed unexpectedly: RuntimeError" in by_name["res-2"].error
    assert ["res-2"] in node.batches, "retried one by one after the batch failed"


def test_a_kind_that_says_freed_but_left_it_is_not_believed(node: FakeNode) -> None:
    one = node.attachment(1, node.add("res-1"))
    node.lie.add("res-1")
    outcomes, _ = reclaimer(node).run([one], {})
    assert not outcomes[0].ok
    assert outcomes[0].resources[0].error == "still present after reclaiming"


def test_a_gone_record_of_a_kind_the_last_look_read_partly_is_not_verified(node: FakeNode) -> None:
    one = node.attachment(1, node.add("res-1"))
    node.partly_read = frozenset({"fake"})
    outcomes, _ = reclaimer(node).run([one], {})
    assert not outcomes[0].ok
    assert "not verified" in str(outcomes[0].resources[0].error)


def test_a_stop_before_the_run_starts_nothing(node: FakeNode) -> None:
    one = two_resources(node, 1)
    r = reclaimer(node)
    r.stop.set()
    outcomes, skipped = r.run([one], {})
    assert outcomes == []
    assert [(s.key, s.reason) for s in skipped] == [(one.key, "stopping")]
    assert node.batches == [] and len(node.records) == 2


def test_a_stop_during_the_run_leaves_the_kernel_step_undone(node: FakeNode) -> None:
    one = two_resources(node, 1)
    stop = threading.Event()

    def look_then_stop() -> NodeSnapshot:
        stop.set()  # the stop arrives while DEL's look runs
        return node.look()

    r = bare_reclaimer(look=look_then_stop, observe=runtime, registry=node.registry)
    r.stop = stop
    outcomes, skipped = r.run([one], {})
    assert skipped == []
    assert node.batches == []
    assert {r.error for r in outcomes[0].resources} == {"interrupted: stopping"}


def test_an_attachment_whose_sandbox_is_listed_again_is_skipped_whole(node: FakeNode) -> None:
    one, two = two_resources(node, 1), two_resources(node, 2)
    outcomes, skipped = reclaimer(node, runtime(sandbox(1))).run([one, two], {})
    assert [(s.key, s.reason) for s in skipped] == [(one.key, "its sandbox is listed again")]
    assert [o.key for o in outcomes] == [two.key]
    assert {r.name for r in node.records.values()} == {"res-1", "last-1"}


def test_a_sandbox_listed_again_before_the_kernel_step_keeps_its_resources(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = two_resources(node, 1)
    # The first view answers the re-check before DEL, the second the one before the kernel step
    # (with no window, and every read of the clock later than the last, the first is stale by
    # then and not reused).
    monkeypatch.setattr(act, "RECHECK_WINDOW", 0.0)
    monkeypatch.setattr(act, "LOOK_SHARE", 0)
    r = reclaimer(node, runtime(), runtime(sandbox(1)))
    r.clock = ManualClock(tick=1.0)
    outcomes, skipped = r.run([one], {})
    assert skipped == []
    assert {r.error for r in outcomes[0].resources} == {"its sandbox is listed again"}
    assert len(node.records) == 2 and node.batches == []


def test_a_namespace_a_mount_holds_since_the_scan_is_left_at_the_recheck(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-check reads the mounts of every mount namespace again: one made after the scan
    keeps the attachment whose namespace it holds, and mounts that cannot all be read keep
    every attachment."""
    one, two = two_resources(node, 1), two_resources(node, 2)
    assert one.netns is not None
    held = {one.netns: "its netns is held by a mount at /x in mount namespace mnt:[9] (pid 7)"}
    monkeypatch.setattr(nsmounts, "busy_namespaces", lambda bin_dirs, only=None: {})
    monkeypatch.setattr(nsmounts, "mount_held", lambda dirs, proc="/proc", parsed=None: held)
    outcomes, skipped = reclaimer(node).run([one, two], {})
    assert [(s.key, s.reason) for s in skipped] == [(one.key, held[one.netns])]
    assert [o.key for o in outcomes] == [two.key] and {r.name for r in node.records.values()} == {"res-1", "last-1"}
    unseen = EveryNamespaceBusy("the mounts that may hold its netns cannot all be read now")
    monkeypatch.setattr(nsmounts, "mount_held", lambda dirs, proc="/proc", parsed=None: unseen)
    three = two_resources(node, 3)
    outcomes, skipped = reclaimer(node).run([three], {})
    assert outcomes == [] and [s.reason for s in skipped] == [unseen.reason]


def test_a_runtime_unreachable_at_the_recheck_leaves_every_attachment(node: FakeNode) -> None:
    one, two = two_resources(node, 1), two_resources(node, 2)
    outcomes, skipped = reclaimer(node, runtime(reachable=False)).run([one, two], {})
    assert outcomes == []
    assert {s.key for s in skipped} == {one.key, two.key}
    assert all(s.reason.startswith(UNREACHABLE_AT_RECHECK) for s in skipped)
    assert len(node.records) == 4


def test_a_stateful_chain_without_a_del_keeps_what_its_del_needs(node: FakeNode) -> None:
    one, two = two_resources(node, 1), two_resources(node, 2)
    outcomes, _ = reclaimer(node).run([one, two], {}, keep={one.key: "calico-ipam"})
    first, second = outcomes
    assert first.needs_plugin == "calico-ipam" and second.needs_plugin is None
    kept = {r.name: r for r in first.resources}
    assert kept["res-1"].ok, "what no DEL needs goes"
    assert not kept["last-1"].ok and "calico-ipam may keep state" in str(kept["last-1"].error)
    assert "no DEL runs" in str(kept["last-1"].error)
    assert second.ok
    assert {r.name for r in node.records.values()} == {"last-1"}


def test_a_network_whose_plugin_is_not_available_gets_no_step(node: FakeNode, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_plugin(bin_dir, status_error="the daemon is down")
    one = two_resources(node, 1)
    r = reclaimer(node, bin_dirs=(str(bin_dir),))
    r.network_configs = {"mynet": plugin_config()}
    outcomes, skipped = r.run([one], {})
    assert outcomes == []
    assert len(skipped) == 1
    assert "CNI STATUS" in skipped[0].reason and "the daemon is down" in skipped[0].reason
    assert verbs_run(bin_dir) == ["STATUS"]
    assert len(node.records) == 2


def test_status_is_asked_once_a_pass_for_each_config(node: FakeNode, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_plugin(bin_dir)
    one, two = two_resources(node, 1), two_resources(node, 2)
    r = reclaimer(node, bin_dirs=(str(bin_dir),))
    r.network_configs = {"mynet": plugin_config()}
    outcomes, skipped = r.run([one, two], {})
    assert skipped == [] and all(o.ok for o in outcomes)
    assert verbs_run(bin_dir) == ["STATUS"]


def plugin_node(node: FakeNode, tmp_path: Path, *, del_fails: bool) -> tuple[Path, Attachment, DelRequest]:
    """Attachment 1, whose `res-1` its plugin's DEL frees."""
    bin_dir = tmp_path / "bin"
    fake_plugin(bin_dir, del_fails=del_fails)
    one = two_resources(node, 1)
    node.freed_by[("fake", "res-1")] = bin_dir / f"deleted-{cid(1)}"
    return bin_dir, one, request_for(one, plugin_config())


def test_what_del_freed_is_reported_as_the_plugins(node: FakeNode, tmp_path: Path) -> None:
    bin_dir, one, request = plugin_node(node, tmp_path, del_fails=False)
    outcomes, _ = reclaimer(node, bin_dirs=(str(bin_dir),)).run([one], {one.key: request}, keep={one.key: "x-ipam"})
    methods = {r.name: (r.method, r.ok) for r in outcomes[0].resources}
    assert methods == {"res-1": ("cni-del", True), "last-1": ("kernel", True)}
    assert outcomes[0].plugin_errors == () and outcomes[0].needs_plugin is None
    assert verbs_run(bin_dir) == ["STATUS", "DEL"]


def test_a_failed_del_is_reported_and_a_stateful_chain_keeps_its_last_record(node: FakeNode, tmp_path: Path) -> None:
    bin_dir, one, request = plugin_node(node, tmp_path, del_fails=True)
    outcomes, _ = reclaimer(node, bin_dirs=(str(bin_dir),)).run([one], {one.key: request}, keep={one.key: "x-ipam"})
    outcome = outcomes[0]
    assert len(outcome.plugin_errors) == 1 and "DEL broke" in outcome.plugin_errors[0]
    assert outcome.needs_plugin == "x-ipam"
    by_name = {r.name: r for r in outcome.resources}
    assert by_name["res-1"].method == "kernel" and by_name["res-1"].ok
    assert not by_name["last-1"].ok and "has not succeeded" in str(by_name["last-1"].error)


def test_a_del_that_raises_is_that_attachments_error(
    node: FakeNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir, one, request = plugin_node(node, tmp_path, del_fails=False)

    def broken(*_args: object, **_kwargs: object) -> Callable[[], None]:
        raise OSError("no fork")

    monkeypatch.setattr(act, "del_network", broken)
    outcomes, _ = reclaimer(node, bin_dirs=(str(bin_dir),)).run([one], {one.key: request})
    assert outcomes[0].plugin_errors == ("DEL failed unexpectedly: OSError: no fork",)
    assert outcomes[0].ok, "the kernel step frees what DEL did not"


def test_a_reclaim_line_says_del_and_kernel_when_both_freed_something(node: FakeNode, tmp_path: Path) -> None:
    bin_dir, one, request = plugin_node(node, tmp_path, del_fails=False)
    outcomes, _ = reclaimer(node, bin_dirs=(str(bin_dir),)).run([one], {one.key: request})
    assert reclaim_log_fields(one, outcomes[0]) == {
        "container_id": cid(1),
        "network": "mynet",
        "ifname": "eth0",
        "method": "cni-del+kernel",
    }


def test_a_reclaim_line_of_a_lone_pin_names_the_pin() -> None:
    key = AttachmentKey(None, None, None, "/run/netns/cni-1")
    freed = ResourceOutcome(kind="netns", name="cni-1", method="quarantine", ok=True, error=None)
    assert reclaim_log_fields(None, ReclaimOutcome(key, (freed,), ())) == {
        "netns_pin": "/run/netns/cni-1",
        "method": "quarantine",
    }


def test_a_failed_del_line_names_the_pod_network_and_container(
    node: FakeNode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bin_dir, one, request = plugin_node(node, tmp_path, del_fails=True)
    one = replace(one, pod="shop/cart-7f9c")  # as reconcile reads it from a cache entry
    with caplog.at_level(logging.WARNING, logger="test"):
        reclaimer(node, bin_dirs=(str(bin_dir),)).run([one], {one.key: request})
    (line,) = [r for r in caplog.records if r.getMessage() == "plugin DEL failed"]
    expected = {"container_id": cid(1), "network": "mynet", "pod_namespace": "shop", "pod_name": "cart-7f9c"}
    assert expected.items() <= vars(line).items() and vars(line)["method"] == "cni-del"
    assert "DEL broke" in vars(line)["error"]
