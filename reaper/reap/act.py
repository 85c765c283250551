"""Acting on orphans the runtime just confirmed are not its own: plugin DEL, then each kind's
own reclaim for what DEL left, then a last look that says what is really gone. Each batch is
re-checked right before it is acted on: docs/design.md, "Batches and windows in the act step"."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple

from msgspec import Struct, field

from reaper.cni.invoke import PLUGIN_PATH, del_network, network_status
from reaper.cni.requests import DelRequest
from reaper.host.netns_addrs import Handle, NamespaceAddresses, NamespaceToRead, read_addresses
from reaper.host.nsmounts import ParsedMountinfo, in_use
from reaper.host.quarantine import Quarantine
from reaper.kinds import Kind, ReclaimContext
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import (
    Attachment,
    AttachmentKey,
    Done,
    Identity,
    NodeSnapshot,
    NsKey,
    ReclaimMethod,
    ReclaimOutcome,
    ResourceOutcome,
    RuntimeView,
    SkippedAttachment,
)
from reaper.options import COMMAND_TIMEOUT
from reaper.reap import delegates
from reaper.reap.logfields import attachment_log_fields
from reaper.reap.plan import Listed, listed, recheck_reason
from reaper.reap.requests import Records, index, netns_for_del, pins_of
from reaper.reap.stays import held_in_staying, kept_with_namespace, lives_in, staying_namespaces
from reaper.settings import DEL_CONCURRENCY
from reaper.stopwatch import Stopwatch

UNREACHABLE_AT_RECHECK = "runtime unreachable at the re-check"
STAYING_DEADLINE = 5.0  # seconds for reading the addresses of the pass's pins that stay, all together
# Seconds after a re-check within which what it cleared may be acted on (SECURITY.md, "The
# re-check window"); never shorter than LOOK_SHARE times that look took.
RECHECK_WINDOW = 1.0
LOOK_SHARE = 4
FIRST_KERNEL_BATCH = 128  # records in a kind's first batch, before its pace is known
MIN_BATCH = 16
# A kind's batches a step at most: what it pays once a batch grows with the node.
MAX_KERNEL_BATCHES = 4
LATE_TRIES = 3  # times a DEL may miss its window before its attachment waits for the next pass


def read_staying(targets: Sequence[NamespaceToRead]) -> list[NamespaceAddresses]:
    """The addresses configured in each of the pass's pins that stay, within one deadline."""
    return read_addresses(targets, deadline=time.monotonic() + STAYING_DEADLINE)


def _kept_because(what: str, no_del: bool, pinned: bool) -> str:
    """Why a record a later DEL needs stays, for a chain that keeps state elsewhere. `pinned`: it
    has a real pin, so its DEL was kept from running otherwise (refused, or --method kernel)."""
    kept, tools = f"kept: {what} may keep state only its DEL frees, and", "free it with the plugin's own tools"
    if no_del and pinned:
        return f"{kept} that DEL does not run for it (its plan says why); {tools}, then remove this"
    if no_del:
        return f"{kept} no DEL runs for an attachment no netns pin proves; {tools}, then remove this"
    return f"{kept} that DEL has not succeeded as the runtime would run it"


class Recheck(NamedTuple):
    """What a re-check found: why each attachment must be left, the namespaces the runtimes
    named (live), who is in which namespace, and when it finished (on the reclaimer's clock)."""

    left: dict[AttachmentKey, str]
    live_netns: frozenset[NsKey] = frozenset()
    busy: Mapping[NsKey, str] = {}
    at: float = 0.0


class NodeView(NamedTuple):
    """One look at who may still use an orphan: who is in which namespace, then what the runtimes
    list (None when they could not all be asked: `error`), and when it was complete."""

    busy: Mapping[NsKey, str]
    now: Listed | None
    error: str | None
    at: float

    def judge(self, attachments: Iterable[Attachment]) -> Recheck:
        """Why each of `attachments` must be left after all, by this view."""
        if self.now is None:
            return Recheck({a.key: f"{UNREACHABLE_AT_RECHECK}: {self.error}" for a in attachments}, at=self.at)
        now, busy = self.now, self.busy
        left = {a.key: why for a in attachments if (why := recheck_reason(a, now, busy)) is not None}
        return Recheck(left, now.netns, busy, self.at)


DelDone = tuple[AttachmentKey, tuple[str, ...], str | None, bool]  # key, plugin errors, why left, window missed


def _unpinned(
    attachments: Sequence[Attachment],
    present: Records,
    done: Mapping[Identity, Done],
    staying: Mapping[NsKey, str] | str,
    registry: Registry,
) -> frozenset[NsKey]:
    """The namespaces whose pin this step freed and that no record keeps (`staying`)."""
    if isinstance(staying, str):
        return frozenset()
    freed = (ref for a in attachments for ref in a.resources if (r := done.get(ref.identity)) is not None and r.ok)
    pins = (registry.pin_of(ref, present) for ref in freed)
    return frozenset(pin.ns for pin in pins if pin is not None and pin.ns not in staying)


class _Views:
    """A step's looks, the last with the namespaces it described and its window. In the kernel
    step one serves every batch that starts within half its window and whose namespaces it
    described (each describes every namespace the step may still act on, `wide`)."""

    def __init__(self, take: Callable[[Set[NsKey]], NodeView], clock: Callable[[], float]) -> None:
        self.take = take
        self.clock = clock
        self.last: NodeView | None = None
        self.described: frozenset[NsKey] = frozenset()
        self.window = RECHECK_WINDOW

    def look(self, namespaces: frozenset[NsKey]) -> NodeView:
        """A new look describing `namespaces`; its window follows how long it took."""
        self.described = namespaces
        began = self.clock()
        self.last = self.take(namespaces)
        self.window = max(RECHECK_WINDOW, LOOK_SHARE * (self.last.at - began))
        return self.last

    def fresh(self, namespaces: frozenset[NsKey], wide: frozenset[NsKey]) -> NodeView:
        last = self.last
        if last is None or self.clock() - last.at > self.window / 2 or not namespaces <= self.described:
            return self.look(namespaces | wide)
        return last


class Reclaimer(Struct, kw_only=True):
    """The act and verify steps of one pass."""

    look: Callable[[], NodeSnapshot]  # a fresh look at the node
    netns_dirs: tuple[str, ...]
    bin_dirs: tuple[str, ...]
    live_netns: frozenset[NsKey]  # namespaces the runtime named when the pass was planned
    plugin_timeout: float
    quarantine: Quarantine | None
    log: logging.Logger
    stop: threading.Event
    observe: Callable[[], RuntimeView]  # the runtimes, asked again
    watch: Stopwatch = field(default_factory=Stopwatch)
    del_concurrency: int = DEL_CONCURRENCY  # plugin DELs at once: bounds a burst's memory, not CPUs
    network_configs: Mapping[str, bytes] = field(default_factory=dict)  # asked for STATUS
    plugin_path: str = PLUGIN_PATH  # where the plugins' DEL finds the node's iptables backend
    read_netns: Callable[[Sequence[NamespaceToRead]], list[NamespaceAddresses]] = read_staying
    registry: Registry = REGISTRY  # the kinds it reclaims, in order; `look` should use the same
    # Seconds, for the re-check windows and the batches' pace: every window is judged on it.
    clock: Callable[[], float] = field(default=time.monotonic)
    _statuses: dict[bytes, str | None] = field(default_factory=dict)
    _mounts: ParsedMountinfo = field(default_factory=ParsedMountinfo)  # parsed again only if changed
    _status_lock: threading.Lock = field(default_factory=threading.Lock)

    def view(self, namespaces: Set[NsKey]) -> NodeView:
        """Who is in which namespace now (`namespaces` described, any other with a process busy),
        then what the runtimes list: last, so that it is the freshest part of the view."""
        busy = in_use(self.bin_dirs, self.netns_dirs, namespaces, self._mounts) if namespaces else {}
        view = self.observe()
        now = listed(view) if view.reachable else None
        return NodeView(busy, now, view.error, self.clock())

    def _busy_from(self, found: Recheck, namespaces: Set[NsKey], window: float) -> Callable[[], Mapping[NsKey, str]]:
        """Who is in which namespace for a kind about to act: the re-check's walk within the window, else a new walk."""

        def busy() -> Mapping[NsKey, str]:
            if self.clock() - found.at <= window:
                return found.busy
            return in_use(self.bin_dirs, self.netns_dirs, namespaces, self._mounts)

        return busy

    def run(
        self,
        attachments: Sequence[Attachment],
        requests: Mapping[AttachmentKey, DelRequest | None],
        judged: Records | None = None,
        keep: Mapping[AttachmentKey, str] | None = None,
        planned_on: NodeSnapshot | None = None,
    ) -> tuple[list[ReclaimOutcome], list[SkippedAttachment]]:
        """Reclaim each attachment, re-checked in batches before its DEL and before each batch
        of the kernel step; those the DEL step's re-check leaves are skipped whole. `keep`:
        requests.kept_state by attachment; `planned_on`: the planning look, which serves as the
        look after DEL when no attachment has a DEL to run."""
        self.watch.restart()
        plugin_errors, left_before_del, live, del_views = self._del_all(attachments, requests)
        skipped = [SkippedAttachment(a.key, left_before_del[a.key]) for a in attachments if a.key in left_before_del]
        acting = [a for a in attachments if a.key not in left_before_del]
        self.watch.lap("del")
        no_del = all(request is None for request in requests.values())
        after = planned_on if planned_on is not None and no_del else self.look()
        after_del = index(after, self.registry)
        # Every pin of the pass's orphans, those left too: the address check did not read them.
        pass_pins = pins_of(attachments, after_del, self.registry)
        self.watch.lap("look")
        # A chain that keeps state elsewhere keeps what its DEL reads unless that DEL ran as the
        # runtime would run it (with the pin, or without_netns) and succeeded.
        needs_plugin = {
            key: what
            for key, what in (keep or {}).items()
            if (request := requests.get(key)) is None
            or not (request.netns or request.without_netns)
            or plugin_errors.get(key)
        }
        kernel_done = self._kernel(
            acting,
            after_del,
            needs_plugin,
            {key for key in needs_plugin if requests.get(key) is None},
            judged or {},
            live=live,
            unread=after.partly_read,
            pass_pins=pass_pins,
            views=del_views if no_del else None,
        )
        self.watch.lap("kernel")
        last_look = self.look()
        final = index(last_look, self.registry)
        self.watch.lap("verify")
        outcomes = []
        for a in acting:
            results = []
            for ref in a.resources:
                gone = ref.identity not in final
                by_del = ref.identity not in after_del and requests.get(a.key) is not None
                done = None if by_del else kernel_done.get(ref.identity)
                quarantined = done is not None and done.quarantined
                method: ReclaimMethod = "cni-del" if by_del else "quarantine" if quarantined else "kernel"
                error = done.error if done is not None and not done.ok else None
                if gone and ref.kind in last_look.partly_read:
                    gone, error = False, f"not verified: the last look could not read all of {ref.kind}"
                error = None if gone else error or "still present after reclaiming"
                results.append(ResourceOutcome(kind=ref.kind, name=ref.name, method=method, ok=gone, error=error))
            outcomes.append(
                ReclaimOutcome(a.key, tuple(results), plugin_errors.get(a.key, ()), needs_plugin.get(a.key))
            )
        return outcomes, skipped

    def status(self, config: bytes) -> str | None:
        """The network's answer to CNI STATUS, asked once a pass per config: a plugin not
        available gets neither DEL nor kernel step for its attachments this pass."""
        with self._status_lock:
            if config not in self._statuses:
                self._statuses[config] = network_status(
                    config, self.bin_dirs, self.plugin_timeout, self.stop, path=self.plugin_path
                )
            return self._statuses[config]

    def _del_all(
        self, attachments: Sequence[Attachment], requests: Mapping[AttachmentKey, DelRequest | None]
    ) -> tuple[dict[AttachmentKey, tuple[str, ...]], dict[AttachmentKey, str], frozenset[NsKey], _Views]:
        """Each attachment's DEL, in batches each re-checked right before it goes to the pool;
        a DEL starts within its batch's window or goes back for the next batch. (plugin errors,
        why each was left, the namespaces the runtimes named, the step's looks)."""

        def one(attachment: Attachment, cleared_at: float, window: float) -> DelDone:
            key, request = attachment.key, requests.get(attachment.key)
            if self.stop.is_set():
                return key, (), "stopping", False
            config = request.config if request is not None else self.network_configs.get(key.network or "")
            unavailable = self.status(config) if config is not None else None
            if unavailable is not None:
                return key, (), f"waits: a plugin of its network is not available (CNI STATUS): {unavailable}", False
            if request is None:
                return key, (), None, False
            if self.clock() - cleared_at > window:
                return key, (), None, True
            try:
                with delegates.pinned(request) as (ready, changed):
                    if ready is None:
                        return key, (f"no plugin ran: {changed}",), None, False
                    outcomes = del_network(ready, self.bin_dirs, self.plugin_timeout, self.stop, path=self.plugin_path)
            except Exception as err:  # this attachment's error; the others go on
                return key, (f"DEL failed unexpectedly: {type(err).__name__}: {err}",), None, False
            return key, tuple(o.error for o in outcomes if o.error), None, False

        errors: dict[AttachmentKey, tuple[str, ...]] = {}
        left: dict[AttachmentKey, str] = {}
        live: set[NsKey] = set()
        queue = deque(attachments)
        by_key = {a.key: a for a in attachments}
        late: dict[AttachmentKey, int] = {}
        batch, views = 4 * self.del_concurrency, _Views(self.view, self.clock)
        started = self.clock()
        finished = 0
        pace, look_took = 0.0, 0.0  # DELs finished a second so far; the last re-check's seconds
        with ThreadPoolExecutor(max_workers=self.del_concurrency) as pool:
            running: set[Future[DelDone]] = set()
            while queue or running:
                if queue and self.stop.is_set():
                    left.update((a.key, "stopping") for a in queue)
                    queue.clear()
                if queue and len(running) <= self.del_concurrency + int(pace * look_took):
                    # The pool is about to run dry: re-check the next batch while the last DELs
                    # run (as many as it gets through in one re-check). No-DEL attachments count
                    # for nothing: the kernel step re-checks them.
                    chunk, dels = [], 0
                    while queue and dels < batch:
                        chunk.append(queue.popleft())
                        dels += requests.get(chunk[-1].key) is not None
                    began = self.clock()
                    found = views.look(frozenset(a.netns for a in chunk if a.netns is not None)).judge(chunk)
                    look_took = found.at - began
                    self.log.debug(
                        "re-checked a batch of DELs",
                        extra={"attachments": len(chunk), "dels": dels, "seconds": round(look_took, 3)},
                    )
                    live |= found.live_netns
                    left.update(found.left)
                    running |= {pool.submit(one, a, found.at, views.window) for a in chunk if a.key not in found.left}
                if not running:
                    continue
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    key, found_errors, why, missed = future.result()
                    if missed:
                        late[key] = late.get(key, 0) + 1
                        if late[key] < LATE_TRIES:
                            queue.appendleft(by_key[key])
                        else:
                            left[key] = "no DEL started within the window of its re-check; next pass"
                        continue
                    finished += requests.get(key) is not None
                    if found_errors:
                        errors[key] = found_errors
                    if why is not None:
                        left[key] = why
                # As many as the pool finishes in a window, and never fewer than it can run at once.
                pace = finished / max(self.clock() - started, 1e-3)
                batch = max(self.del_concurrency, int(pace * views.window))
        for key, found_errors in errors.items():
            fields = {"attachment": key.as_text(), **attachment_log_fields(key, by_key.get(key)), "method": "cni-del"}
            for error in found_errors:
                self.log.warning("plugin DEL failed", extra={**fields, "error": error})
        return errors, left, frozenset(live), views

    def _kernel(
        self,
        attachments: Sequence[Attachment],
        present: Records,
        needs_plugin: Mapping[AttachmentKey, str],
        no_del: Set[AttachmentKey],
        judged: Records,
        *,
        live: frozenset[NsKey] = frozenset(),
        unread: Set[str] = frozenset(),
        pass_pins: Mapping[NsKey, str] | None = None,
        views: _Views | None = None,
    ) -> dict[Identity, Done]:
        """Each kind reclaims what is still there, in the registry's order: a `last` kind's record
        once the rest of its attachment is gone; what a needed DEL reads (`needs_plugin`: the
        `last` and `del_needs` kinds') stays; records `with_addresses` only while no namespace
        they live in stays (reaper.reap.stays) and no address they free is configured in one of
        `pass_pins` that stays. `live`: namespaces the re-checks named; `unread`: kinds the look
        after DEL could not read whole; `views`: the DEL step's looks, to go on from."""
        live_netns = self.live_netns | live
        kinds, last = self.registry.kinds, self.registry.last
        done: dict[Identity, Done] = {}
        staying: dict[NsKey, str] | str | None = None
        seen: list[NamespaceAddresses] | None = None

        def kept_for_addresses(
            staying: dict[NsKey, str] | str, a: Attachment, kind: Kind[Any], record: Any
        ) -> str | None:
            """Why a record with addresses stays (the pins that stay are read once, when needed)."""
            nonlocal seen
            why = kept_with_namespace(kinds, a, present, staying)
            frees = kind.frees(record) if kind.frees is not None else ()
            if why is not None or not frees or isinstance(staying, str):
                return why
            if seen is None:
                seen = self._read_staying(pass_pins or {}, staying)
            return held_in_staying(frees, lives_in(kinds, a, present), seen)

        # Attachments a batch's re-check left: none of their records is touched after that.
        left_at: dict[AttachmentKey, str] = {}
        views = views if views is not None else _Views(self.view, self.clock)
        every_ns = frozenset(ns for a in attachments for ns in lives_in(kinds, a, present))
        # Namespaces this step unpinned with nothing else keeping them: gone, no look walks them.
        gone: frozenset[NsKey] = frozenset()
        for kind in self.registry.reclaim_order:
            if self.stop.is_set():
                # Stopping: no new step starts. What was freed is reported; the rest waits.
                stopped = Done.left("interrupted: stopping")
                done.update((r.identity, stopped) for a in attachments for r in a.resources if r.identity not in done)
                break
            if kind.with_addresses and staying is None:
                # Every kind that keeps a namespace has run (reclaim_order): what stays is known.
                staying = staying_namespaces(kinds, present, done, unread)
                gone = _unpinned(attachments, present, done, staying, self.registry)
            chosen: list[tuple[Attachment, Any]] = []
            for a in attachments:
                for ref in a.resources:
                    if ref.kind != kind.name or ref.identity not in present:
                        continue
                    why = left_at.get(a.key)
                    if why is None and (kind.last or kind.del_needs) and a.key in needs_plugin:
                        pinned = bool(netns_for_del(a, present, self.registry))
                        why = _kept_because(needs_plugin[a.key], a.key in no_del, pinned)
                    if why is None and staying is not None and kind.with_addresses:
                        why = kept_for_addresses(staying, a, kind, present[ref.identity])
                    if why is None and kind.last:
                        others = [r.identity for r in a.resources if r.kind not in last and r.identity in present]
                        if not all(done.get(i, Done.freed()).ok for i in others):
                            why = "kept: other resources of the attachment remain"
                    if why is not None:
                        done[ref.identity] = Done.left(why)
                        continue
                    # The record as judged, not as the later look found it: each kind compares the
                    # node with it before it deletes (a lease given to a new pod keeps its path).
                    chosen.append((a, judged.get(ref.identity, present[ref.identity])))
            done.update(
                self._reclaim_batches(kind, chosen, present, (views, every_ns, gone), done, live_netns, left_at)
            )
        return done

    def _reclaim_batches(
        self,
        kind: Kind[Any],
        chosen: Sequence[tuple[Attachment, Any]],
        present: Records,
        looks: tuple[_Views, frozenset[NsKey], frozenset[NsKey]],
        done: Mapping[Identity, Done],
        live_netns: frozenset[NsKey],
        left_at: dict[AttachmentKey, str],
    ) -> dict[Identity, Done]:
        """The kind's reclaim of `chosen`, in batches each judged by a view at most half the window
        old and sized by its pace to take the other half, at most MAX_KERNEL_BATCHES of them. An
        attachment a view leaves is added to `left_at`."""
        views, wide, gone = looks  # the step's looks, every namespace it may act on, and those gone
        out: dict[Identity, Done] = {}
        least = max(MIN_BATCH, -(-len(chosen) // MAX_KERNEL_BATCHES))
        size, at = max(FIRST_KERNEL_BATCH, least), 0
        while at < len(chosen):
            batch = chosen[at : at + size]
            at += len(batch)
            if self.stop.is_set():
                out.update((kind.identity(r), Done.left("interrupted: stopping")) for _, r in chosen[at - len(batch) :])
                break
            owners = {a.key: a for a, _ in batch}.values()
            namespaces = frozenset(ns for a in owners for ns in lives_in(self.registry.kinds, a, present)) - gone
            found = views.fresh(namespaces, wide - gone).judge(owners)
            left_at.update(found.left)
            out.update((kind.identity(r), Done.left(found.left[a.key])) for a, r in batch if a.key in found.left)
            records = [r for a, r in batch if a.key not in found.left]
            started = self.clock()
            if records:
                ctx = ReclaimContext(
                    netns_dirs=self.netns_dirs,
                    bin_dirs=self.bin_dirs,
                    live_netns=live_netns | found.live_netns,
                    quarantine=self.quarantine,
                    command_timeout=COMMAND_TIMEOUT,
                    done={**done, **out},
                    in_use=self._busy_from(found, namespaces, views.window),
                )
                out.update(self._reclaim_isolated(kind, records, ctx))
            took = self.clock() - started
            self.log.debug(
                "reclaimed a batch",
                extra={"kind": kind.name, "records": len(records), "seconds": round(took, 3),
                       "look_age": round(started - found.at, 3)},
            )  # fmt: skip
            size = max(least, int(len(batch) * views.window / 2 / max(took, 1e-3)))
        return out

    def _read_staying(self, pins: Mapping[NsKey, str], staying: Mapping[NsKey, str]) -> list[NamespaceAddresses]:
        """What is configured in each of `pins` that stays (`staying`, with why)."""
        targets = [
            NamespaceToRead(ns, f"the netns pinned at {path} ({staying[ns]})", (Handle(path, pinned=True),))
            for ns, path in sorted(pins.items())
            if ns in staying
        ]
        return self.read_netns(targets) if targets else []

    def _reclaim_isolated(self, kind: Kind[Any], records: list[Any], ctx: ReclaimContext) -> dict[Identity, Done]:
        """The kind's reclaim of the batch; if it fails unexpectedly, of each record alone."""
        try:
            return dict(kind.reclaim(records, ctx))
        except Exception:
            self.log.exception("reclaim failed; retrying one by one", extra={"kind": kind.name})
        done: dict[Identity, Done] = {}
        for record in records:
            try:
                done.update(kind.reclaim([record], ctx))
            except Exception as err:
                done[kind.identity(record)] = Done.left(f"failed unexpectedly: {type(err).__name__}: {err}")
        return done
