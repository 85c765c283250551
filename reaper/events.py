"""Kubernetes Events on the agent's own Node (`LeaksReclaimed`, `BreakerOpen`,
`IPRangeNearlyFull`, `SandboxStuck`), so that `kubectl describe node` shows what the reaper did.

What an Event says comes from the pass's result alone (`pass_events`, pure). Sending is off the
pass's path: a bounded queue and one poster thread, so an API that is down, slow or refusing
costs a log line, never the pass's outcome, report, metrics or exit. Repeats within a window are
counted into the Event's `series`. What operators see: docs/reference.md, "The agent in full";
why events.k8s.io/v1 and how Events are named and aggregated: docs/design.md, "In depth: the
core, state and what is reported"."""

from __future__ import annotations

import contextlib
import datetime
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

from msgspec import Struct

from reaper.kubeapi import KubeApiError, in_cluster, is_node_name, service_account
from reaper.model import ReapResult, ScanReport, ScanResult

if TYPE_CHECKING:
    from lightkube import Client

CONTROLLER = "cni-reaper"
NAMESPACE = "default"  # where Events about a cluster-scoped object go, as the kubelet's Node Events (default)
FULL_SHARE = 0.9  # a range with more than this share of its addresses leased is nearly full
MAX_PER_PASS = 5  # Events one pass may send; the rest of that pass's are dropped
WINDOW = 600.0  # seconds an Event's key is remembered: no second post, one series patch at most
QUEUE_PASSES = 4  # passes whose Events may wait for the poster; a newer one is dropped
MAX_KEYS = 256  # keys remembered at most, the oldest forgotten first
MAX_NOTE = 1024  # events.k8s.io's limit on `note`
MAX_PODS = 10  # pods named in one LeaksReclaimed note; the rest are counted

EventType = Literal["Normal", "Warning"]


class NodeEvent(Struct, frozen=True, kw_only=True):
    """One Event about the Node, before it is sent."""

    reason: str
    type: EventType
    action: str  # events.k8s.io's machine-readable verb
    note: str
    key: str  # what makes two Events the same one: the reason and its subject


def _cut(text: str, limit: int = MAX_NOTE) -> str:
    """`text` in at most `limit` bytes of UTF-8, as the API counts a note."""
    raw = text.encode()
    return text if len(raw) <= limit else raw[: limit - 3].decode(errors="ignore") + "..."


def _event(reason: str, type: EventType, action: str, note: str, key: str) -> NodeEvent:
    return NodeEvent(reason=reason, type=type, action=action, note=_cut(note), key=key)


def _age(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def _leaks_reclaimed(result: ReapResult) -> NodeEvent | None:
    freed = {o.key: o for o in result.reclaimed if any(r.ok for r in o.resources)}
    if not freed:
        return None
    kinds = Counter(r.kind for o in freed.values() for r in o.resources if r.ok)
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    note = f"reclaimed {len(freed)} leaked attachment{'s' if len(freed) != 1 else ''} ({counts})"
    # The pods their cache entries' CNI_ARGS named.
    pods = sorted({a.pod for a in result.report.attachments if a.key in freed and a.pod is not None})
    if pods:
        more = f" and {len(pods) - MAX_PODS} more" if len(pods) > MAX_PODS else ""
        note += f" of pods {', '.join(pods[:MAX_PODS])}{more}"
    return _event("LeaksReclaimed", "Normal", "Reclaim", note, key=f"LeaksReclaimed {note}")


def _nearly_full(report: ScanReport) -> list[NodeEvent]:
    events = []
    for r in report.ranges:
        if r.size > 0 and r.used > FULL_SHARE * r.size:
            leased = f"{r.used} of {r.size} addresses leased ({100 * r.used // r.size}%)"
            note = f"host-local range {r.range} of network {r.network} is nearly full: {leased}"
            key = f"IPRangeNearlyFull {r.network} {r.range}"
            events.append(_event("IPRangeNearlyFull", "Warning", "Observe", note, key))
    return events


def _stuck(report: ScanReport) -> NodeEvent | None:
    stuck = sorted(report.stuck_sandboxes, key=lambda s: (s.namespace, s.name, s.id))
    if not stuck:
        return None
    listed = ", ".join(f"{s.namespace}/{s.name} ({s.id[:12]}, NOTREADY {_age(s.age_seconds)})" for s in stuck)
    note = (
        f"{len(stuck)} sandbox{'es' if len(stuck) != 1 else ''} stuck NOTREADY; the runtime keeps "
        f"{'their' if len(stuck) != 1 else 'its'} network and the reaper leaves it: {listed}"
    )
    return _event("SandboxStuck", "Warning", "Observe", note, key="SandboxStuck " + " ".join(s.id for s in stuck))


def pass_events(result: ReapResult | ScanResult, *, limit: int = MAX_PER_PASS) -> tuple[NodeEvent, ...]:
    """The Events a pass's result calls for, the most telling first, at most `limit`."""
    events: list[NodeEvent] = []
    if isinstance(result, ReapResult):
        if result.breaker_open:
            note = f"breaker open, nothing reclaimed: {result.breaker_reason}"
            events.append(_event("BreakerOpen", "Warning", "Refuse", note, key="BreakerOpen"))
        leaks = _leaks_reclaimed(result)
        if leaks is not None:
            events.append(leaks)
    events.extend(_nearly_full(result.report))
    stuck = _stuck(result.report)
    if stuck is not None:
        events.append(stuck)
    return tuple(events[:limit])


class _Series(Struct, kw_only=True):
    """An Event posted, and its repeats since."""

    name: str
    count: int
    last_seen: float
    written_at: float  # when the API last heard of it (the post, or a series patch)


def _micro_time(at: float) -> datetime.datetime:
    """`at` for a MicroTime field: the API wants six fractional digits, which msgspec omits for
    a whole second, so such a time is moved on by a microsecond."""
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment if moment.microsecond else moment.replace(microsecond=1)


def _micro_text(at: float) -> str:
    """`at` as the API writes a MicroTime (RFC 3339, six fractional digits, UTC)."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventPoster:
    """Posts the Node's Events from a thread of its own; `submit` never waits. `connect` makes
    the API client (reading the service account, in that thread)."""

    def __init__(
        self,
        node: str,
        connect: Callable[[], Client],
        log: logging.Logger,
        *,
        where: str = "",
        namespace: str = NAMESPACE,
        clock: Callable[[], float] = time.time,
        window: float = WINDOW,
        queue_passes: int = QUEUE_PASSES,
    ) -> None:
        self.node = node
        self.connect = connect
        self.where = where  # the API server's host:port, for messages
        self.namespace = namespace  # where the Events are posted (--events-namespace)
        self.log = log
        self.clock = clock
        self.window = window
        self.queue: queue.Queue[tuple[float, tuple[NodeEvent, ...]] | None] = queue.Queue(maxsize=queue_passes)
        self.series: dict[str, _Series] = {}
        self.client: Client | None = None
        self.failing: str | None = None  # the problem last logged, until a post goes through
        self.dropped = 0  # passes whose Events found the queue full
        self.posted = 0  # API writes that went through (posts and patches)
        self._build_failed = False
        self.thread = threading.Thread(target=self._run, name="events", daemon=True)
        self.thread.start()

    def submit(self, result: ReapResult | ScanResult) -> None:
        """Hand a pass's Events to the poster; never raises, never waits."""
        try:
            events = pass_events(result)
        except Exception as err:  # a bug here must not touch the pass: one line, and no Events
            if not self._build_failed:
                self._build_failed = True
                self.log.exception("events not made from the pass", extra={"error": str(err)})
            return
        if not events:
            return
        try:
            self.queue.put_nowait((self.clock(), events))
        except queue.Full:
            self.dropped += 1  # the API is slow: its one log line is the poster's

    def close(self, timeout: float = 1.0) -> None:
        """Stop the poster: what it is sending gets `timeout`, the rest is dropped."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            at, events = item
            for event in events:
                if not self._send(event, at):
                    break  # the API is failing: the rest of this pass's Events would fail too

    def _send(self, event: NodeEvent, at: float) -> bool:
        """Post or count `event`; False when the API failed it (already logged, or now)."""
        from reaper.kubeclient import API_FAILURES, describe, status_of  # noqa: PLC0415

        self._forget(at)
        seen = self.series.get(event.key)
        try:
            if seen is not None and at - seen.last_seen < self.window:
                seen.count += 1
                seen.last_seen = at
                if at - seen.written_at >= self.window and self._patched(event.key, seen):
                    seen.written_at = at
            if event.key not in self.series:
                name = self._call(lambda c: self._post(c, event, at))
                self.series[event.key] = _Series(name=name, count=1, last_seen=at, written_at=at)
        except KubeApiError as err:
            return self._failed(str(err))
        except API_FAILURES as err:
            problem = describe(err, self.where)
            if status_of(err) == 403:
                problem += ": the service account may not post events.k8s.io Events (the chart's events.enabled)"
            return self._failed(problem)
        except Exception as err:  # lightkube or httpx raising what no API call should
            return self._failed(f"{type(err).__name__}: {err}")
        if self.failing is not None:
            self.log.info("events posted again", extra={"after": self.failing})
            self.failing = None
        return True

    def _patched(self, key: str, seen: _Series) -> bool:
        """Patch `seen`'s series; False when its Event is gone (the API keeps Events for an hour
        by default): its key is then forgotten, and a new Event is posted."""
        from reaper.kubeclient import API_FAILURES, status_of  # noqa: PLC0415

        try:
            self._call(lambda c: self._patch(c, seen))
        except API_FAILURES as err:
            if status_of(err) != 404:
                raise
            del self.series[key]
            return False
        return True

    def _call(self, write: Callable[[Client], str]) -> str:
        """`write` with the client; once more with a new one after a 401 (a rotated token)."""
        from reaper.kubeclient import status_of  # noqa: PLC0415

        if self.client is None:
            self.client = self.connect()
        try:
            result = write(self.client)
        except Exception as err:
            if status_of(err) != 401:
                raise
            self.client.close()
            self.client = None  # a failing connect leaves none, and the next call tries again
            self.client = self.connect()
            result = write(self.client)
        self.posted += 1
        return result

    def _post(self, client: Client, event: NodeEvent, at: float) -> str:
        from lightkube.models.core_v1 import ObjectReference  # noqa: PLC0415
        from lightkube.models.meta_v1 import ObjectMeta  # noqa: PLC0415
        from lightkube.resources.events_v1 import Event  # noqa: PLC0415

        # As client-go names them: object name, dot, hex nanoseconds (ending in a letter or digit).
        name = f"{self.node[:236].rstrip('-.')}.{time.time_ns():x}"
        body = Event(
            metadata=ObjectMeta(name=name, namespace=self.namespace),
            eventTime=_micro_time(at),
            reportingController=CONTROLLER,
            reportingInstance=self.node[:128],
            action=event.action,
            reason=event.reason,
            type=event.type,
            note=event.note,
            regarding=ObjectReference(apiVersion="v1", kind="Node", name=self.node, uid=self.node),
        )
        client.create(body, namespace=self.namespace)
        return name

    def _patch(self, client: Client, seen: _Series) -> str:
        from lightkube.resources.events_v1 import Event  # noqa: PLC0415
        from lightkube.types import PatchType  # noqa: PLC0415

        series = {"series": {"count": seen.count, "lastObservedTime": _micro_text(seen.last_seen)}}
        client.patch(Event, seen.name, series, namespace=self.namespace, patch_type=PatchType.MERGE)
        return seen.name

    def _forget(self, now: float) -> None:
        """Keys not seen for a window go (their next Event is a new one), the oldest past MAX_KEYS."""
        for key in [k for k, s in self.series.items() if now - s.last_seen >= self.window]:
            del self.series[key]
        while len(self.series) > MAX_KEYS:
            del self.series[min(self.series, key=lambda k: self.series[k].last_seen)]

    def _failed(self, problem: str) -> bool:
        if self.failing is None:
            self.log.warning("events not posted; the passes go on without them", extra={"error": problem})
        self.failing = problem
        return False


def events_from(
    enabled: bool, node: str | None, env: Mapping[str, str], log: logging.Logger, namespace: str = NAMESPACE
) -> EventPoster | None:
    """The agent's poster, or None with one log line saying why there is none."""
    if not enabled:
        return None
    if not in_cluster(env):
        log.info("events off: not in a pod (no KUBERNETES_SERVICE_HOST), so no API to post them to")
        return None
    if not node or not is_node_name(node):  # it names the Event too: an RFC 1123 subdomain
        log.info("events off: no valid --node-name to post them on", extra={"node": (node or "")[:80]})
        return None

    def connect() -> Client:
        from reaper.kubeclient import api_client  # noqa: PLC0415

        return api_client(service_account(env))

    where = f"{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}"
    return EventPoster(node, connect, log, where=where, namespace=namespace)
