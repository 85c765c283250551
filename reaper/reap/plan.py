"""What a reclaiming pass will do, and what it will not and why. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

from msgspec import Struct
from msgspec.structs import replace

from reaper.cni.requests import DelRequest
from reaper.kinds import cache
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import (
    Attachment,
    AttachmentKey,
    Identity,
    NsKey,
    PlannedAttachment,
    PlannedStep,
    ReapResult,
    ReclaimMethod,
    RuntimeView,
    ScanReport,
    ScanResult,
    SkippedAttachment,
    is_loopback,
)
from reaper.options import ReapPolicy


class Planned(Struct, frozen=True, kw_only=True):
    """What one pass decided before touching anything (run.plan_pass): what `--dry-run` shows,
    `--plan-out` writes and the act step (run.act_on) acts on (docs/design.md, "The plan a pass
    makes")."""

    scan: ScanResult  # the look the plan was made on
    records: Mapping[Identity, Any] = {}  # the look's records by identity; empty if none was weighed
    selected: tuple[Attachment, ...] = ()  # the orphans this pass takes, in order, as reviewed
    requests: Mapping[AttachmentKey, DelRequest | None] = {}  # the DEL each gets (None: no plugin)
    keep: Mapping[AttachmentKey, str] = {}  # requests.kept_state of each that has one
    plan: tuple[PlannedAttachment, ...] = ()  # each selected orphan's steps, in order
    skipped: tuple[SkippedAttachment, ...] = ()  # the orphans left so far, and why
    breaker_reason: str | None = None  # why the breaker refuses the pass (nothing selected)
    timings: tuple[tuple[str, float], ...] = ()  # seconds per step so far
    registry: Registry = REGISTRY  # the kinds the look was made with, and the act step acts with

    def result(self, **changes: Any) -> ReapResult:
        """The pass's result as planned, nothing reclaimed; `changes`: what acting changed."""
        base = ReapResult(
            report=self.scan.report,
            breaker_open=self.breaker_reason is not None,
            breaker_reason=self.breaker_reason,
            plan=self.plan,
            reclaimed=(),
            skipped=self.skipped,
            recheck_error=None,
            timings=self.timings,
            state_saved=self.scan.state_saved,
        )
        return replace(base, **changes)

    def leaving(self, left: Mapping[AttachmentKey, str]) -> Planned:
        """The plan without the orphans in `left`, each skipped with why."""
        return replace(
            self,
            selected=tuple(a for a in self.selected if a.key not in left),
            plan=tuple(p for p in self.plan if p.key not in left),
            skipped=(*self.skipped, *(SkippedAttachment(a.key, left[a.key]) for a in self.selected if a.key in left)),
        )


def plan_attachment(
    attachment: Attachment,
    request: DelRequest | None,
    note: str | None,
    quarantine: bool,
    registry: Registry = REGISTRY,
) -> PlannedAttachment:
    """Each resource's method: the plugins' DEL when there is a config to run it with, else
    the kernel (or the quarantine, for the files a kind can move there)."""
    first: ReclaimMethod = "cni-del" if request is not None else "kernel"
    moved = registry.quarantinable if first == "kernel" and quarantine else frozenset()
    steps = tuple(PlannedStep(r.kind, r.name, "quarantine" if r.kind in moved else first) for r in attachment.resources)
    return PlannedAttachment(attachment.key, request.source if request else None, steps, note)


def breaker_trips(orphans: int, attachments: int, max_ratio: float) -> bool:
    """More than `max_ratio` of the node's attachments look orphaned: likelier a wrong runtime list than such a leak."""
    return attachments > 0 and orphans / attachments > max_ratio


def breaker_counts(attachments: Sequence[Attachment]) -> tuple[int, int]:
    """(orphaned, all) of the pod attachments the breaker weighs: each pod network in a namespace,
    not its loopback, the pending nor the excluded (forged files must not hold the breaker open:
    docs/design.md, "The plan a pass makes")."""
    counted = [
        a
        for a in attachments
        if a.verdict not in ("pending", "excluded")
        and a.netns is not None
        and not is_loopback(a.key.network, a.key.ifname)
    ]
    return sum(1 for a in counted if a.verdict == "orphan"), len(counted)


def breaker_would_trip(report: ScanReport, policy: ReapPolicy) -> bool:
    """Whether a reap of what this scan saw would stop at the breaker: what a report-only pass
    exports, so an operator hears it before switching to reap."""
    if policy.force or not report.runtime.reachable:
        return False
    return breaker_trips(*breaker_counts(report.attachments), policy.max_orphan_ratio)


def breaker_reason(orphans: int, attachments: int, policy: ReapPolicy) -> str | None:
    """Why the breaker refuses to act this pass, or None when it lets the pass go on."""
    if policy.force or not breaker_trips(orphans, attachments, policy.max_orphan_ratio):
        return None
    return (
        f"{orphans} of {attachments} pod attachments ({orphans / attachments:.0%}) look orphaned, over "
        f"--max-orphan-ratio {policy.max_orphan_ratio:g}: more likely the runtime's list is wrong than "
        f"the node leaked that much; nothing reclaimed (--force overrides)"
    )


# Costless orphans (costs_nothing) a pass takes at most, besides --max-reap: a bound on time, not
# on a wrong verdict's cost (docs/design.md, "What --max-reap bounds").
COSTLESS_PER_PASS = 1000


def costs_nothing(attachment: Attachment, records: Mapping[Identity, Any]) -> bool:
    """Whether a wrong verdict would cost no pod anything: in no namespace, and every resource a
    cache entry reaper.kinds.cache.costless calls so (a loopback's), as the look found it."""
    if attachment.netns is not None or not attachment.resources:
        return False
    entries = (cache.KIND.record(ref, records) for ref in attachment.resources)
    return all(entry is not None and cache.costless(entry) for entry in entries)


def select(
    orphans: Sequence[Attachment], policy: ReapPolicy, costless: Set[AttachmentKey] = frozenset()
) -> tuple[list[Attachment], list[SkippedAttachment]]:
    """The orphans this pass takes, and those left for the next: at most --max-reap of those not
    `costless`, those in a namespace first (forgeable files never take a leak's place), and at
    most COSTLESS_PER_PASS of the `costless` besides."""
    bounded = sorted((a for a in orphans if a.key not in costless), key=lambda a: a.netns is None)
    free = [a for a in orphans if a.key in costless]
    deferred = [
        SkippedAttachment(a.key, f"over --max-reap {policy.max_reap}; next pass") for a in bounded[policy.max_reap :]
    ]
    deferred += [
        SkippedAttachment(a.key, f"over {COSTLESS_PER_PASS} costless files a pass; next pass")
        for a in free[COSTLESS_PER_PASS:]
    ]
    return bounded[: policy.max_reap] + free[:COSTLESS_PER_PASS], deferred


class Listed(Struct, frozen=True, kw_only=True):
    """What the runtimes listed at a re-check: the sandbox IDs and the namespaces they name."""

    ids: frozenset[str]
    netns: frozenset[NsKey]


def listed(view: RuntimeView) -> Listed:
    return Listed(
        ids=frozenset(s.id for s in view.sandboxes),
        netns=frozenset(s.netns for s in view.sandboxes if s.netns is not None),
    )


def recheck_reason(attachment: Attachment, now: Listed, busy: Mapping[NsKey, str]) -> str | None:
    """Why an orphan must be left after all, by what the runtime and the node say right now."""
    if attachment.key.container_id is not None and attachment.key.container_id in now.ids:
        return "its sandbox is listed again"
    if attachment.netns is not None:
        if attachment.netns in now.netns:
            return "its netns belongs to a sandbox listed now"
        return busy.get(attachment.netns)
    return None
