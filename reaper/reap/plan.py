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
)
from reaper.options import ReapPolicy


class Planned(Struct, frozen=True, kw_only=True):
    """What one pass decided before touching anything (reaper.reap.run.plan_pass): what
    `--dry-run` shows and `--plan-out` writes, and what the act step (run.act_on) acts on, each
    orphan re-checked again right before it is touched.

    - scan: the look the plan was made on (its report, its snapshot, the runtime's netns paths)
    - records: the look's records by identity (reaper.reap.requests.index); empty when the pass
      stopped before weighing any orphan (runtime unreachable, no orphans, the breaker)
    - selected: the orphans this pass takes, in the order it takes them, as reviewed
    - requests: the DEL each orphan selected gets (None: no plugin runs), those the review then
      left included
    - keep: for each selected orphan whose cache entry outlives a DEL that fails or does not run,
      the plugins of its chain that keep state only that DEL frees (requests.kept_state)
    - plan: each selected orphan's steps and where its DEL takes its config from, in order
    - skipped: the orphans left so far, and why (waiting, over --max-reap, not as reviewed)
    - breaker_reason: why the breaker refuses the pass (nothing is then selected); None when not
    - timings: seconds per step so far (the scan)
    - registry: the kinds the look was made with, which the act step acts with
    """

    scan: ScanResult
    records: Mapping[Identity, Any] = {}
    selected: tuple[Attachment, ...] = ()
    requests: Mapping[AttachmentKey, DelRequest | None] = {}
    keep: Mapping[AttachmentKey, str] = {}
    plan: tuple[PlannedAttachment, ...] = ()
    skipped: tuple[SkippedAttachment, ...] = ()
    breaker_reason: str | None = None
    timings: tuple[tuple[str, float], ...] = ()
    registry: Registry = REGISTRY

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
    steps = []
    quarantinable = registry.quarantinable
    for ref in attachment.resources:
        method: ReclaimMethod = first
        if first == "kernel" and quarantine and ref.kind in quarantinable:
            method = "quarantine"
        steps.append(PlannedStep(ref.kind, ref.name, method))
    return PlannedAttachment(attachment.key, request.source if request else None, tuple(steps), note)


def breaker_trips(orphans: int, attachments: int, max_ratio: float) -> bool:
    """More than `max_ratio` of the node's attachments look orphaned: more likely a wrong
    runtime list than a leak that large."""
    return attachments > 0 and orphans / attachments > max_ratio


LOOPBACK_NETWORK = "cni-loopback"  # the network containerd and CRI-O give a sandbox's lo


def breaker_counts(attachments: Sequence[Attachment]) -> tuple[int, int]:
    """(orphaned, all) of the node's pod attachments the breaker weighs: each pod network a
    sandbox has, not its loopback (which would count every pod twice), not the pending nor the
    excluded (counted as not orphaned, kept pods would hide a wrong runtime list), and only
    those in a namespace. A wrong runtime list shows as namespaces that look orphaned; an
    attachment with none (a lease, a cache entry, a chain) is no pod's, and whoever can write
    /var/lib/cni could otherwise forge enough of them to keep the breaker open for good."""
    counted = [
        a
        for a in attachments
        if a.verdict not in ("pending", "excluded")
        and a.netns is not None
        and a.key.ifname != "lo"
        and a.key.network != LOOPBACK_NETWORK
    ]
    return sum(1 for a in counted if a.verdict == "orphan"), len(counted)


def breaker_would_trip(report: ScanReport, policy: ReapPolicy) -> bool:
    """Whether a reap of what this scan saw would stop at the breaker, as reap_pass weighs it:
    what a report-only pass exports (the agent's in scan mode, a one-shot `scan --textfile`), so
    that an operator hears before switching to reap that it would reclaim nothing."""
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


# Costless orphans (costs_nothing) a pass takes at most, besides --max-reap. Not a bound on a
# wrong verdict's cost (there is none): each costs the pass a re-check and a re-read before its
# unlink, and this many keep a pass well within its time while a node with 30,000 such files
# is clean within an hour of the agent's passes.
COSTLESS_PER_PASS = 1000


def costs_nothing(attachment: Attachment, records: Mapping[Identity, Any]) -> bool:
    """Whether reclaiming the attachment would cost no pod anything, were its verdict wrong: it
    is in no namespace, and each of its resources is a cache entry reaper.kinds.cache.costless
    calls so (a loopback's), as the look found it. A pin, a veth, a lease, a chain, any file
    that may name an address or be the only record of what a DEL needs: not costless."""
    if attachment.netns is not None or not attachment.resources:
        return False
    for ref in attachment.resources:
        entry = cache.KIND.record(ref, records)
        if entry is None or not cache.costless(entry):
            return False
    return True


def select(
    orphans: Sequence[Attachment], policy: ReapPolicy, costless: Set[AttachmentKey] = frozenset()
) -> tuple[list[Attachment], list[SkippedAttachment]]:
    """The orphans this pass takes, and those left for the next: at most --max-reap of those a
    wrong verdict could cost a pod something, and besides them at most COSTLESS_PER_PASS of
    the `costless` ones (costs_nothing), whose number --max-reap does not bound. Those in a
    namespace come first: an attachment of files alone (which whoever can write them could
    forge, and which may get a DEL with no netns) never takes the place of a leak the kernel
    shows."""
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
