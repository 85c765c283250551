"""The reclaim path's re-checks come one per batch, not one per attachment, and a batch is acted
on only within the re-check window: every DEL starts, and every kind's batch is handed over,
at most RECHECK_WINDOW after the re-check that cleared it (a later one waits for a new one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pytest
from msgspec.structs import replace

from reaper.cni.requests import DelRequest
from reaper.kinds import ReclaimContext
from reaper.model import Attachment, Done, Identity, NsKey, RuntimeView
from reaper.reap import act
from tests.harness.passes import bare_reclaimer
from tests.harness.reclaim_fakes import (
    FAKE,
    FAKE_LAST,
    FAKE_LEASE,
    FAKE_PIN,
    FakeNode,
    plugin_config,
    request_for,
)
from tests.harness.snapshots import runtime

Walk = tuple[float, frozenset[NsKey]]


class Walks:
    """A stand-in for the /proc and mount walk (act.in_use): when each walk finished and which
    namespaces it described; nothing is busy."""

    def __init__(self) -> None:
        self.done: list[Walk] = []
        self._lock = threading.Lock()

    def __call__(
        self,
        bin_dirs: tuple[str, ...],
        netns_dirs: tuple[str, ...],
        only: Collection[NsKey] | None = None,
        parsed: object = None,
    ) -> Mapping[NsKey, str]:
        with self._lock:
            self.done.append((time.monotonic(), frozenset(only or ())))
        return {}

    def last_covering(self, ns: NsKey, before: float) -> float | None:
        """When the latest walk that described `ns` finished, of those done by `before`."""
        times = [at for at, only in self.done if ns in only and at <= before]
        return max(times) if times else None


def attachments(node: FakeNode, count: int) -> list[Attachment]:
    return [node.attachment(n, node.add(f"res-{n}"), node.add(f"last-{n}", FAKE_LAST)) for n in range(count)]


def counted(view: RuntimeView) -> tuple[list[float], Any]:
    asked: list[float] = []

    def observe() -> RuntimeView:
        asked.append(time.monotonic())
        return view

    return asked, observe


def test_the_runtimes_are_asked_once_a_batch_not_once_an_attachment(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks = Walks()
    monkeypatch.setattr(act, "in_use", walks)
    monkeypatch.setattr(act, "RECHECK_WINDOW", 60.0)  # every look stays fresh: each is reused
    found = attachments(node, 400)
    asked, observe = counted(runtime())
    outcomes, skipped = bare_reclaimer(look=node.look, registry=node.registry, observe=observe).run(found, {})
    assert skipped == [] and len(outcomes) == 400 and all(o.ok for o in outcomes)
    assert node.records == {}
    assert len(node.batches) > 2, "the kinds took several batches each"
    # One look for the DEL step, which every batch of the kernel step reuses while it is fresh
    # and describes their namespaces: one per attachment, as before batching, would be 400 and more.
    assert len(asked) == 1, f"{len(asked)} re-checks for 400 attachments"
    assert len(walks.done) == 1, f"{len(walks.done)} walks of /proc for 400 attachments"


def test_no_del_starts_later_than_the_window_after_its_re_check(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DELs slower than the window allows for one batch: each starts within the window of the
    walk that cleared its namespace, and every attachment still gets its DEL."""
    window = 0.3
    monkeypatch.setattr(act, "RECHECK_WINDOW", window)
    walks = Walks()
    monkeypatch.setattr(act, "in_use", walks)
    monkeypatch.setattr(act, "network_status", lambda *_args, **_kwargs: None)
    started: dict[str, float] = {}
    lock = threading.Lock()

    def slow_del(request: DelRequest, *_args: object, **_kwargs: object) -> list[Any]:
        with lock:
            started[request.container_id] = time.monotonic()
        time.sleep(0.04)
        return []

    monkeypatch.setattr(act, "del_network", slow_del)
    found = attachments(node, 60)
    requests: dict[Any, DelRequest | None] = {a.key: request_for(a, plugin_config()) for a in found}
    asked, observe = counted(runtime())
    outcomes, skipped = bare_reclaimer(look=node.look, registry=node.registry, observe=observe, del_concurrency=2).run(
        found, requests
    )
    assert skipped == [] and len(outcomes) == 60
    assert set(started) == {str(a.key.container_id) for a in found}, "every attachment got its DEL"
    for a in found:
        assert a.netns is not None
        at = started[str(a.key.container_id)]
        cleared = walks.last_covering(a.netns, at)
        assert cleared is not None, f"{a.key.as_text()}: DEL with no re-check before it"
        assert at - cleared <= window + 0.05, f"{a.key.as_text()}: DEL {at - cleared:.2f}s after its re-check"
    assert 2 < len(asked) < 60, "more than one batch, fewer than one re-check an attachment"


def test_a_kind_gets_the_batch_walk_and_a_new_one_once_the_window_passed(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind asking who is in a namespace right before it acts gets its batch's walk while
    that is within the window, and a walk made then once it is not (a kind that waited, as the
    veth kind waits for the kernel to drop veths)."""
    window = 0.2
    monkeypatch.setattr(act, "RECHECK_WINDOW", window)
    walks = Walks()
    monkeypatch.setattr(act, "in_use", walks)
    asked_at: list[tuple[int, int]] = []  # walks done when the kind was handed its batch, and after it asked

    def reclaim(records: Sequence[Any], ctx: ReclaimContext) -> dict[Identity, Done]:
        handed = len(walks.done)
        if not asked_at:
            time.sleep(window + 0.05)  # the first batch waits past the window before it asks
        ctx.busy()
        asked_at.append((handed, len(walks.done)))
        return {(r.kind, r.name): Done.freed() for r in records if node.records.pop((r.kind, r.name), None)}

    kinds = tuple(replace(k, reclaim=reclaim) if k.name == FAKE else k for k in node.kinds)
    node.use(kinds)
    found = [node.attachment(n, node.add(f"res-{n}")) for n in range(3)]
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run(found, {})
    assert all(o.ok for o in outcomes)
    assert len(asked_at) == 1, "one batch"
    handed, asked = asked_at[0]
    assert handed >= 1, "the batch was judged by a walk"
    assert asked == handed + 1, "a walk of its own once the window passed"


def test_after_the_pins_go_the_looks_walk_no_namespace_they_freed(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace whose pin the step freed, with nothing else keeping it, is gone: the looks
    before the later kinds' batches ask the runtimes again but walk the node for no such one;
    one whose pin stays is walked for again."""
    monkeypatch.setattr(act, "RECHECK_WINDOW", 0.0)  # no look serves two batches
    walks = Walks()
    monkeypatch.setattr(act, "in_use", walks)
    found = [
        node.attachment(n, node.add(f"pin-{n}", FAKE_PIN, ns=NsKey(4, 5000 + n)), node.add(f"lease-{n}", FAKE_LEASE))
        for n in range(20)
    ]
    node.leave["pin-3"] = "busy"
    asked, observe = counted(runtime())
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry, observe=observe).run(found, {})
    assert [o.key for o in outcomes if not o.ok] == [found[3].key]
    after_pins = walks.done[2:]  # the DEL step's batch, then the pins' batch
    assert after_pins and all(only == {NsKey(4, 5003)} for _, only in after_pins), after_pins
    assert len(asked) == 3, "the runtimes are asked again before the leases' batch"
    assert ("fakelease", "lease-3") in node.records, "kept with the namespace its pin keeps"


def test_a_slow_kind_takes_a_bounded_number_of_batches(node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind whose every batch outlasts the window (a wait, a save of the whole ruleset) is not
    cut into ever smaller batches: what it pays once a batch grows with the node, so the step
    stays linear with at most MAX_KERNEL_BATCHES of them."""
    monkeypatch.setattr(act, "RECHECK_WINDOW", 0.001)
    monkeypatch.setattr(act, "in_use", Walks())
    kinds = tuple(replace(k, reclaim=_slow(k.reclaim)) for k in node.kinds)
    node.use(kinds)
    found = [node.attachment(n, node.add(f"res-{n}")) for n in range(1000)]
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run(found, {})
    assert all(o.ok for o in outcomes)
    assert 1 < len(node.batches) <= act.MAX_KERNEL_BATCHES, [len(b) for b in node.batches]


def _slow(reclaim: Any) -> Any:
    def slow(records: Sequence[Any], ctx: ReclaimContext) -> Any:
        time.sleep(0.01)
        return reclaim(records, ctx)

    return slow


def test_with_no_del_asked_the_kernel_step_starts_from_the_planned_look(node: FakeNode) -> None:
    """No DEL to run: nothing but the kernel step changes the records the pass was planned on,
    so no look is taken between (the verify look is the only one); with a DEL asked, the kernel
    step starts from a look taken after the DELs."""
    found = attachments(node, 3)
    planned = node.look()
    node.looks = 0
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run(
        found, {a.key: None for a in found}, planned_on=planned
    )
    assert all(o.ok for o in outcomes) and node.records == {}
    assert node.looks == 1, "only the verify look"

    more = attachments(node, 3)
    planned = node.look()
    node.looks = 0
    requests: dict[Any, DelRequest | None] = {a.key: None for a in more}
    requests[more[0].key] = request_for(more[0], plugin_config())
    bare_reclaimer(look=node.look, registry=node.registry).run(more, requests, planned_on=planned)
    assert node.looks == 2, "a look after the DELs, and the verify look"
