"""The reclaim path's re-checks come one per batch, not one per attachment, and a batch is acted
on only within the re-check window: every DEL starts, and every kind's batch is handed over,
at most RECHECK_WINDOW after the re-check that cleared it (a later one waits for a new one).
The windows are judged on the reclaimer's clock, here a ManualClock that moves only when the
test says: every bound is exact, whatever the machine's load."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence, Set
from typing import Any

import pytest
from msgspec.structs import replace

from reaper.cni.requests import DelRequest
from reaper.kinds import ReclaimContext
from reaper.model import Attachment, Done, Identity, NsKey, RuntimeView
from reaper.reap import act
from tests.harness.clocks import ManualClock
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


class Walks:
    """A stand-in for the /proc and mount walk (act.in_use): which namespaces each walk
    described; nothing is busy."""

    def __init__(self) -> None:
        self.done: list[frozenset[NsKey]] = []
        self._lock = threading.Lock()

    def __call__(
        self,
        bin_dirs: tuple[str, ...],
        netns_dirs: tuple[str, ...],
        only: Collection[NsKey] | None = None,
        parsed: object = None,
    ) -> Mapping[NsKey, str]:
        with self._lock:
            self.done.append(frozenset(only or ()))
        return {}


class Views:
    """The reclaimer's views (Reclaimer.view, a re-check's look), recorded as it takes them: the
    namespaces each described and when it was complete, the `at` its window runs from."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken: list[tuple[frozenset[NsKey], float]] = []
        view = act.Reclaimer.view

        def recorded(reclaimer: act.Reclaimer, namespaces: Set[NsKey]) -> act.NodeView:
            found = view(reclaimer, namespaces)
            self.taken.append((frozenset(namespaces), found.at))
            return found

        monkeypatch.setattr(act.Reclaimer, "view", recorded)

    def covering(self, ns: NsKey, first: int) -> list[float]:
        """When each view that described `ns` was complete, of the `first` views taken."""
        return [at for described, at in self.taken[:first] if ns in described]


def attachments(node: FakeNode, count: int) -> list[Attachment]:
    return [node.attachment(n, node.add(f"res-{n}"), node.add(f"last-{n}", FAKE_LAST)) for n in range(count)]


def counted(view: RuntimeView) -> tuple[list[RuntimeView], Any]:
    asked: list[RuntimeView] = []

    def observe() -> RuntimeView:
        asked.append(view)
        return view

    return asked, observe


def test_the_runtimes_are_asked_once_a_batch_not_once_an_attachment(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks = Walks()
    monkeypatch.setattr(act, "in_use", walks)
    found = attachments(node, 400)
    asked, observe = counted(runtime())
    # The clock never moves: every look stays fresh, and each is reused while it describes the batch.
    reclaimer = bare_reclaimer(look=node.look, registry=node.registry, observe=observe, clock=ManualClock())
    outcomes, skipped = reclaimer.run(found, {})
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
    """DELs slower than the window allows for one batch: the decision to start each DEL is made
    at most the window after the re-check that cleared it, one that would start later is
    re-checked again, and every attachment still gets its DEL. The clock moves only by the
    first DELs run (a batch's worth), one worker running them in turn: each decision's time is
    exact, and which DEL comes past its window is known."""
    window = 0.75
    first_batch = 4  # the DELs the first re-check clears: 4 times the one worker
    del_takes = window / 3 + 2**-30  # the first batch's fourth DEL would start just past the window
    monkeypatch.setattr(act, "RECHECK_WINDOW", window)
    # A window is RECHECK_WINDOW whatever its look took: a DEL ending during a look would make
    # the look seem to take that long on this clock, and its window longer.
    monkeypatch.setattr(act, "LOOK_SHARE", 0)
    monkeypatch.setattr(act, "in_use", Walks())
    monkeypatch.setattr(act, "network_status", lambda *_args, **_kwargs: None)
    clock = ManualClock()
    views = Views(monkeypatch)
    # Each DEL's clock value its window was judged against, and the views taken before it.
    judged: dict[str, tuple[float | None, int]] = {}

    def slow_del(request: DelRequest, *_args: object, **_kwargs: object) -> list[Any]:
        # The worker's last read of the clock is the window check right before this DEL.
        judged[request.container_id] = (clock.last_read(), len(views.taken))
        if len(judged) <= first_batch:
            clock.advance(del_takes)  # the first DELs each take that long, the rest no time
        return []

    monkeypatch.setattr(act, "del_network", slow_del)
    found = attachments(node, 60)
    requests: dict[Any, DelRequest | None] = {a.key: request_for(a, plugin_config()) for a in found}
    asked, observe = counted(runtime())
    reclaimer = bare_reclaimer(look=node.look, registry=node.registry, observe=observe, del_concurrency=1, clock=clock)
    outcomes, skipped = reclaimer.run(found, requests)
    assert skipped == [] and len(outcomes) == 60
    assert set(judged) == {str(a.key.container_id) for a in found}, "every attachment got its DEL"
    re_checked_again = []
    for a in found:
        assert a.netns is not None
        at, views_before = judged[str(a.key.container_id)]
        cleared = views.covering(a.netns, views_before)
        assert cleared, f"{a.key.as_text()}: DEL with no re-check before it"
        assert at is not None, f"{a.key.as_text()}: DEL with no look at the clock: no window checked"
        assert at - cleared[-1] <= window, f"{a.key.as_text()}: DEL {at - cleared[-1]}s after its re-check"
        if len(cleared) > 1:
            re_checked_again.append(a.key)
    # Three DELs of del_takes each went before the fourth: its start would be 3 * 2**-30 s past
    # the window, so it alone waited for a new re-check.
    assert re_checked_again == [found[3].key], re_checked_again
    assert 2 < len(asked) < 60, "more than one batch, fewer than one re-check an attachment"


WINDOW = 0.25


@pytest.mark.parametrize(("waited", "walks_again"), [(WINDOW, False), (WINDOW + 2**-30, True)])
def test_a_kind_gets_the_batch_walk_and_a_new_one_once_the_window_passed(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch, waited: float, walks_again: bool
) -> None:
    """A kind asking who is in a namespace right before it acts gets its batch's walk while
    that is within the window, to its very end, and a walk made then once it is not (a kind
    that waited, as the veth kind waits for the kernel to drop veths)."""
    monkeypatch.setattr(act, "RECHECK_WINDOW", WINDOW)
    walks = Walks()
    monkeypatch.setattr(act, "in_use", walks)
    clock = ManualClock()
    asked_at: list[tuple[int, int]] = []  # walks done when the kind was handed its batch, and after it asked

    def reclaim(records: Sequence[Any], ctx: ReclaimContext) -> dict[Identity, Done]:
        handed = len(walks.done)
        clock.advance(waited)  # the batch waits before it asks
        ctx.busy()
        asked_at.append((handed, len(walks.done)))
        return {(r.kind, r.name): Done.freed() for r in records if node.records.pop((r.kind, r.name), None)}

    kinds = tuple(replace(k, reclaim=reclaim) if k.name == FAKE else k for k in node.kinds)
    node.use(kinds)
    found = [node.attachment(n, node.add(f"res-{n}")) for n in range(3)]
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry, clock=clock).run(found, {})
    assert all(o.ok for o in outcomes)
    assert len(asked_at) == 1, "one batch"
    handed, asked = asked_at[0]
    assert handed == 1, "the batch was judged by the DEL step's walk, still fresh"
    assert asked == handed + walks_again, "a walk of its own once the window passed, and only then"


def test_after_the_pins_go_the_looks_walk_no_namespace_they_freed(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace whose pin the step freed, with nothing else keeping it, is gone: the looks
    before the later kinds' batches ask the runtimes again but walk the node for no such one;
    one whose pin stays is walked for again."""
    # No look serves two batches: the window is none, and every read of the clock is later.
    monkeypatch.setattr(act, "RECHECK_WINDOW", 0.0)
    monkeypatch.setattr(act, "LOOK_SHARE", 0)
    walks = Walks()
    monkeypatch.setattr(act, "in_use", walks)
    found = [
        node.attachment(n, node.add(f"pin-{n}", FAKE_PIN, ns=NsKey(4, 5000 + n)), node.add(f"lease-{n}", FAKE_LEASE))
        for n in range(20)
    ]
    node.leave["pin-3"] = "busy"
    asked, observe = counted(runtime())
    reclaimer = bare_reclaimer(look=node.look, registry=node.registry, observe=observe, clock=ManualClock(tick=1.0))
    outcomes, _ = reclaimer.run(found, {})
    assert [o.key for o in outcomes if not o.ok] == [found[3].key]
    after_pins = walks.done[2:]  # the DEL step's batch, then the pins' batch
    assert after_pins and all(only == {NsKey(4, 5003)} for only in after_pins), after_pins
    assert len(asked) == 3, "the runtimes are asked again before the leases' batch"
    assert ("fakelease", "lease-3") in node.records, "kept with the namespace its pin keeps"


def test_a_slow_kind_takes_a_bounded_number_of_batches(node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind whose every batch outlasts the window (a wait, a save of the whole ruleset) is not
    cut into ever smaller batches: what it pays once a batch grows with the node, so the step
    stays linear with at most MAX_KERNEL_BATCHES of them."""
    monkeypatch.setattr(act, "RECHECK_WINDOW", 0.001)
    monkeypatch.setattr(act, "in_use", Walks())
    clock = ManualClock()
    kinds = tuple(replace(k, reclaim=_slow(k.reclaim, clock)) for k in node.kinds)
    node.use(kinds)
    found = [node.attachment(n, node.add(f"res-{n}")) for n in range(1000)]
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry, clock=clock).run(found, {})
    assert all(o.ok for o in outcomes)
    assert 1 < len(node.batches) <= act.MAX_KERNEL_BATCHES, [len(b) for b in node.batches]


def _slow(reclaim: Any, clock: ManualClock) -> Any:
    """`reclaim`, each batch of it taking 10 ms on `clock`: ten times the window."""

    def slow(records: Sequence[Any], ctx: ReclaimContext) -> Any:
        clock.advance(0.01)
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


@pytest.mark.parametrize(("waited", "looks_again"), [(0.5, False), (0.5 + 2**-30, True)])
def test_a_look_serves_later_batches_for_half_its_window_only(
    monkeypatch: pytest.MonkeyPatch, waited: float, looks_again: bool
) -> None:
    """The kernel step hands a batch the last look while it is younger than half the window (the
    other half is the batch's to act in), and only for the namespaces that look described."""
    monkeypatch.setattr(act, "RECHECK_WINDOW", 1.0)
    monkeypatch.setattr(act, "LOOK_SHARE", 0.0)
    clock = ManualClock()
    taken: list[frozenset[NsKey]] = []

    def take(namespaces: Set[NsKey]) -> act.NodeView:
        taken.append(frozenset(namespaces))
        return act.NodeView({}, None, "fake", clock())

    first, other = NsKey(4, 1), NsKey(4, 2)
    views = act._Views(take, clock)
    views.look(frozenset({first}))
    clock.advance(waited)
    views.fresh(frozenset({first}), frozenset())
    assert len(taken) == (2 if looks_again else 1)
    views.fresh(frozenset({other}), frozenset())  # a namespace no look described: always a new look
    assert taken[-1] == {other} and len(taken) == (3 if looks_again else 2)
