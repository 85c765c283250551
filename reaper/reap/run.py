"""One reclaiming pass: plan_pass (scan, the breaker, the review, select, what each orphan
gets), then act_on what it planned (re-check, the address check, plugin DEL, the kinds, verify)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from msgspec.structs import replace

from reaper.cni.invoke import PLUGIN_PATH
from reaper.host.iptables_backend import GivenPath, PathPlan, plan_plugin_path, plugin_path
from reaper.host.memo import InventoryMemo
from reaper.host.quarantine import Quarantine, expire
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import (
    Attachment,
    AttachmentKey,
    ReapResult,
    ReclaimOutcome,
    ScanReport,
    ScanResult,
    SkippedAttachment,
)
from reaper.options import ReapPolicy
from reaper.reap.act import UNREACHABLE_AT_RECHECK, Reclaimer
from reaper.reap.addresses import addresses_in_use
from reaper.reap.logfields import reclaim_log_fields
from reaper.reap.plan import Planned, breaker_counts, breaker_reason, costs_nothing, select
from reaper.reap.requests import DROPPED, NO_PIN, NOT_LISTED_HERE, index, orphan_trust, plan_orphan
from reaper.reap.review import PlanFile, plan_keys, reviewed_orphans, steps_changed
from reaper.reap.trust import NO_KERNEL_EVIDENCE
from reaper.runtime.liveness import LivenessSource
from reaper.scan import scan_pass
from reaper.settings import ReapSettings, Settings
from reaper.snapshot import take_snapshot
from reaper.state import KeptState
from reaper.stopwatch import Stopwatch


def _expire_quarantine(directory: str, max_age: float, log: logging.Logger, now: float) -> None:
    """--quarantine-max-age: what this reaper quarantined longer ago goes, before the pass adds more."""
    expired = expire(directory, max_age, now)
    if expired.deleted:
        log.info("quarantine expired", extra={"deleted": expired.deleted, "dir": directory})
    for line in expired.left:
        log.warning("quarantine: left", extra={"reason": line})
    if expired.more_left:
        log.warning("quarantine: left", extra={"reason": f"and {expired.more_left} more"})


def _log_plugin_path(log: logging.Logger, plan: PathPlan, given: GivenPath) -> None:
    """The pass's iptables backend for plugin DELs: info, or a warning when it could not be given."""
    fields = {
        "backend": plan.choice.backend or "unknown",
        "reason": plan.choice.reason,
        "private_dir": given.path != PLUGIN_PATH,
    }
    if plan.problem is not None:
        log.warning(plan.describe(), extra=fields)
    elif given.problem is not None:
        log.warning(f"{plan.describe()}, but {given.problem}", extra=fields)
    else:
        log.info(plan.describe(), extra=fields)


def reap_pass(
    settings: Settings,
    reap: ReapSettings,
    liveness: LivenessSource,
    log: logging.Logger,
    clock: Callable[[], float] = time.time,
    memo: InventoryMemo | None = None,
    stop: threading.Event | None = None,
    kept: KeptState | None = None,
    reviewed: PlanFile | None = None,
    *,
    registry: Registry = REGISTRY,
) -> ReapResult:
    """One pass: plan_pass, then act_on what it planned (a dry run: preview only). `stop`, once
    set, lets the step under way finish and starts no new one; `memo`, `kept`: carried from pass
    to pass (scan_pass); `reviewed`: a plan file, only what it names, unchanged, is reclaimed."""
    if reap.policy.quarantine_dir and not reap.dry_run:
        _expire_quarantine(reap.policy.quarantine_dir, reap.quarantine_max_age, log, clock())
    planned = plan_pass(settings, reap, liveness, log, clock, memo, kept=kept, reviewed=reviewed, registry=registry)
    if reap.dry_run:
        return preview(planned, settings).result()
    if not planned.selected:
        return planned.result()
    return act_on(planned, settings, reap, liveness, log, memo, stop)


def plan_pass(
    settings: Settings,
    reap: ReapSettings,
    liveness: LivenessSource,
    log: logging.Logger,
    clock: Callable[[], float] = time.time,
    memo: InventoryMemo | None = None,
    *,
    kept: KeptState | None = None,
    reviewed: PlanFile | None = None,
    registry: Registry = REGISTRY,
) -> Planned:
    """The plan step of a pass: the look, the breaker, the review's narrowing, the orphans the
    pass takes and what each gets. Touches nothing on the node."""
    watch = Stopwatch()
    scan = scan_pass(
        settings,
        liveness,
        log,
        clock,
        memo,
        kept=kept,
        allow_plugins=reap.allow_plugins,
        plugins_run=not reap.policy.kernel_only,
        registry=registry,
    )
    report = scan.report
    policy = reap.policy
    watch.lap("scan")
    nothing = Planned(scan=scan, timings=tuple(watch.laps), registry=registry)
    if not report.runtime.reachable:
        return nothing
    orphans, waiting, dropped = _orphans(report, reap.drop_waiting)
    left = [SkippedAttachment(a.key, a.reason) for a in waiting]
    if not orphans and reviewed is None:
        return replace(nothing, skipped=tuple(left))
    weighed = breaker_counts(report.attachments)
    refused = breaker_reason(*weighed, policy)
    if refused is not None:
        log.error("breaker open", extra={"orphans": weighed[0], "attachments": weighed[1]})
        return replace(nothing, breaker_reason=refused)
    if reviewed is not None:
        # Narrowed only: what the plan does not name, as it is now, counts as someone else's.
        orphans, not_reviewed = reviewed_orphans(orphans, report.attachments, reviewed)
        left = not_reviewed + left
        if not orphans:
            return replace(nothing, skipped=tuple(left))
    planned = _decide(scan, orphans, waiting, dropped, policy, reap.allow_plugins, log, registry)
    if reviewed is not None:  # without the orphans whose steps are not what the plan reviewed
        keys = plan_keys(reviewed)
        differs = {
            p.key: f"not as reviewed: {why}" for p in planned.plan if (why := steps_changed(p, keys)) is not None
        }
        planned = planned.leaving(differs)
    return replace(planned, skipped=(*left, *planned.skipped), timings=nothing.timings)


def _orphans(
    report: ScanReport, drop_waiting: tuple[str, ...]
) -> tuple[list[Attachment], list[Attachment], set[AttachmentKey]]:
    """(the orphans a pass weighs, the waiting it leaves, the keys of the waiting it takes as
    orphans: --drop-waiting, their files go as files). The waiting never count under --max-reap."""
    orphans = [a for a in report.attachments if a.verdict == "orphan"]
    waiting = [a for a in report.attachments if a.verdict == "waiting"]
    dropped = {a.key for a in waiting if a.key.container_id in drop_waiting}
    orphans += [a for a in waiting if a.key in dropped]
    waiting = [a for a in waiting if a.key not in dropped]
    return orphans, waiting, dropped


def _decide(
    scan: ScanResult,
    orphans: list[Attachment],
    waiting: list[Attachment],
    dropped: set[AttachmentKey],
    policy: ReapPolicy,
    allow_plugins: tuple[str, ...],
    log: logging.Logger,
    registry: Registry,
) -> Planned:
    """The orphans this pass takes, and what each gets; why a config does not run is logged, as
    news or, when something was refused, a warning."""
    records = index(scan.snapshot, registry)
    configs = scan.snapshot.configs
    costless = {a.key for a in orphans if costs_nothing(a, records)}
    trust = orphan_trust(
        scan.snapshot, records, orphans, allow_plugins, waiting=waiting, gone_here=scan.gone_here, registry=registry
    )
    selected, deferred = select(orphans, policy, costless)
    # A costless orphan gets no DEL (none could, with no pin), and no log line for each of thousands.
    decided = {
        a.key: plan_orphan(
            a, records, configs, trust, kernel_only=policy.kernel_only, quarantine=policy.quarantine,
            costless=a.key in costless, dropped=a.key in dropped, registry=registry,
        )
        for a in selected
    }  # fmt: skip
    for key, one in decided.items():
        note = one.planned.config_note
        if note is not None:
            # No kernel object: a partial ADD's leftovers (a lease, a chain) look so too, so it is news, not a warning.
            level = logging.INFO if note in (NO_KERNEL_EVIDENCE, NO_PIN, NOT_LISTED_HERE, DROPPED) else logging.WARNING
            log.log(level, "plugin config refused", extra={"attachment": key.as_text(), "reason": note})
    return Planned(
        scan=scan,
        records=records,
        selected=tuple(selected),
        requests={key: one.request for key, one in decided.items()},
        keep={key: one.keep for key, one in decided.items() if one.keep is not None},
        plan=tuple(decided[a.key].planned for a in selected),
        skipped=tuple(deferred),
        registry=registry,
    )


def preview(planned: Planned, settings: Settings) -> Planned:
    """What a dry run shows and --plan-out writes: the plan without the orphans the address check
    (which reads the kernel only) would leave."""
    held = addresses_in_use(planned.selected, planned.records, settings.find.netns_dirs, registry=planned.registry)
    return planned.leaving(held)


def act_on(
    planned: Planned,
    settings: Settings,
    reap: ReapSettings,
    liveness: LivenessSource,
    log: logging.Logger,
    memo: InventoryMemo | None = None,
    stop: threading.Event | None = None,
) -> ReapResult:
    """The act step of a pass, unless `stop` is set: the runtimes asked again (and before each
    batch, reaper.reap.act), the address check, the Reclaimer, a log line for each outcome."""
    if stop is not None and stop.is_set():
        stopping = (SkippedAttachment(a.key, "stopping") for a in planned.selected)
        return planned.result(skipped=(*planned.skipped, *stopping))
    watch = Stopwatch()
    # Before acting, ask the runtimes again: an ID that reappeared, or a netns someone entered, is left alone.
    view = liveness.observe(planned.scan.known_netns)
    watch.lap("recheck")
    if not view.reachable:
        skipped = (*planned.skipped, *(SkippedAttachment(a.key, UNREACHABLE_AT_RECHECK) for a in planned.selected))
        return planned.result(skipped=skipped, recheck_error=view.error, timings=planned.timings + tuple(watch.laps))
    # Files can be split from their namespace; where the kernel has an address cannot be forged.
    held = addresses_in_use(planned.selected, planned.records, settings.find.netns_dirs, registry=planned.registry)
    for key, why in held.items():
        log.warning("left: address in use", extra={"attachment": key.as_text(), "reason": why})
    acting = planned.leaving(held)
    watch.lap("addresses")
    options = settings.find
    own = [c for c in planned.scan.snapshot.configs if not c.cached]
    reclaimer = Reclaimer(
        look=lambda: take_snapshot(options, memo, planned.registry),
        registry=planned.registry,
        netns_dirs=settings.find.netns_dirs,
        bin_dirs=settings.find.bin_dirs,
        live_netns=frozenset(s.netns for s in view.sandboxes if s.netns is not None),
        plugin_timeout=reap.plugin_timeout,
        del_concurrency=reap.del_concurrency,
        quarantine=Quarantine(reap.policy.quarantine_dir) if reap.policy.quarantine_dir else None,
        log=log,
        stop=stop if stop is not None else threading.Event(),
        observe=lambda: liveness.observe(planned.scan.known_netns),
        watch=watch,
        network_configs={c.name: c.raw for c in reversed(own)},
    )
    outcomes, left = _reclaim(reclaimer, acting, settings, log)
    # A runtime that stopped answering during the pass makes it undecided, as at the first re-check.
    lost = next((s.reason.split(": ", 1)[-1] for s in left if s.reason.startswith(UNREACHABLE_AT_RECHECK)), None)
    _log_outcomes(log, outcomes, acting.selected)
    return planned.result(
        reclaimed=tuple(outcomes),
        skipped=(*acting.skipped, *left),
        recheck_error=lost,
        timings=planned.timings + tuple(watch.laps),
    )


def _reclaim(
    reclaimer: Reclaimer, acting: Planned, settings: Settings, log: logging.Logger
) -> tuple[list[ReclaimOutcome], list[SkippedAttachment]]:
    """The Reclaimer's run over what `acting` selected, its DELs given the node's iptables backend."""
    keep = {a.key: acting.keep[a.key] for a in acting.selected if a.key in acting.keep}
    # Only a pass with a DEL to run reads the node's iptables backend (four saves at most).
    path_plan = plan_plugin_path(PLUGIN_PATH) if any(r is not None for r in acting.requests.values()) else None
    with plugin_path(path_plan, PLUGIN_PATH, beside=settings.state_file) as given:
        if path_plan is not None:
            _log_plugin_path(log, path_plan, given)
        reclaimer.plugin_path = given.path
        return reclaimer.run(list(acting.selected), acting.requests, acting.records, keep, acting.scan.snapshot)


def _log_outcomes(log: logging.Logger, outcomes: list[ReclaimOutcome], judged: tuple[Attachment, ...]) -> None:
    by_key = {a.key: a for a in judged}
    for outcome in outcomes:
        log.info(
            "reclaimed" if outcome.ok else "reclaim incomplete",
            extra={
                "attachment": outcome.key.as_text(),
                **reclaim_log_fields(by_key.get(outcome.key), outcome),
                "resources": ",".join(
                    f"{r.kind}:{r.name}:{r.method}:{'ok' if r.ok else r.error}" for r in outcome.resources
                ),
            },
        )
