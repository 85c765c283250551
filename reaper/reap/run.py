"""One reclaiming pass: scan, plan, re-check, act (plugin DEL, then the kinds), verify."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from msgspec.structs import replace

from reaper.cni.invoke import PLUGIN_PATH
from reaper.host.iptables_backend import GivenPath, PathPlan, plan_plugin_path, plugin_path
from reaper.host.memo import InventoryMemo
from reaper.host.quarantine import Quarantine, expire
from reaper.model import ReapResult, SkippedAttachment
from reaper.reap.act import UNREACHABLE_AT_RECHECK, Reclaimer
from reaper.reap.addresses import addresses_in_use
from reaper.reap.logfields import reclaim_log_fields
from reaper.reap.plan import ReapPolicy, breaker_counts, breaker_reason, costs_nothing, plan_attachment, select
from reaper.reap.requests import NO_PIN, NOT_LISTED_HERE, del_request, held_by_others, index, kept_state
from reaper.reap.review import PlanFile, plan_keys, reviewed_orphans, steps_changed
from reaper.reap.trust import NO_KERNEL_EVIDENCE, node_trust, proven_namespaces
from reaper.runtime.liveness import LivenessSource
from reaper.scan import find_options, scan_pass
from reaper.settings import ReapSettings, Settings
from reaper.snapshot import take_snapshot
from reaper.state import KeptState
from reaper.stopwatch import Stopwatch

DROPPED = "no plugin runs: --drop-waiting names it; its files go as files"


def _policy(reap: ReapSettings) -> ReapPolicy:
    return ReapPolicy(
        max_reap=reap.max_reap,
        max_orphan_ratio=reap.max_orphan_ratio,
        kernel_only=reap.kernel_only,
        quarantine=reap.quarantine_dir is not None,
        force=reap.force,
    )


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
    """The pass's iptables backend for plugin DELs, once: info, or a warning when the backend the
    node uses could not be given to them."""
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
) -> ReapResult:
    """One pass. `stop`, once set, lets the step under way finish and starts no new one.
    `memo` and `kept`: what a long-running caller carries from pass to pass (see scan_pass).
    `reviewed`: a plan file (reaper.reap.review); only what it names, unchanged, is reclaimed."""
    stop = stop if stop is not None else threading.Event()
    watch = Stopwatch()
    if reap.quarantine_dir and not reap.dry_run:
        _expire_quarantine(reap.quarantine_dir, reap.quarantine_max_age, log, clock())
    scan = scan_pass(
        settings,
        liveness,
        log,
        clock,
        memo,
        kept=kept,
        allow_plugins=reap.allow_plugins,
        plugins_run=not reap.kernel_only,
    )
    report = scan.report
    policy = _policy(reap)
    watch.lap("scan")

    def result(**changes: Any) -> ReapResult:
        base = ReapResult(
            report=report,
            breaker_open=False,
            breaker_reason=None,
            plan=(),
            reclaimed=(),
            skipped=(),
            recheck_error=None,
            timings=tuple(watch.laps),
            state_saved=scan.state_saved,
        )
        return replace(base, **changes)

    if not report.runtime.reachable:
        return result()
    orphans = [a for a in report.attachments if a.verdict == "orphan"]
    # No pass can do anything for these (reaper.reap.waiting): reported with why, and never
    # counted under --max-reap, so that any number of them never holds back what can be freed.
    waiting = [a for a in report.attachments if a.verdict == "waiting"]
    # But those the operator names (--drop-waiting, with a reviewed plan: reaper.cli), once the
    # plugin's own tools freed what they record: their files go as files, and no DEL runs.
    dropped = {a.key for a in waiting if a.key.container_id in reap.drop_waiting}
    orphans += [a for a in waiting if a.key in dropped]
    waiting = [a for a in waiting if a.key not in dropped]
    if not orphans and reviewed is None:
        return result(skipped=tuple(SkippedAttachment(a.key, a.reason) for a in waiting))
    weighed = breaker_counts(report.attachments)
    refused = breaker_reason(*weighed, policy)
    if refused is not None:
        log.error("breaker open", extra={"orphans": weighed[0], "attachments": weighed[1]})
        return result(breaker_open=True, breaker_reason=refused)
    not_reviewed: list[SkippedAttachment] = []
    if reviewed is not None:
        # Narrowed only: what the plan does not name, as it is now, counts as someone else's.
        orphans, not_reviewed = reviewed_orphans(orphans, report.attachments, reviewed)
        if not orphans:
            return result(skipped=tuple(not_reviewed + [SkippedAttachment(a.key, a.reason) for a in waiting]))
    records = index(scan.snapshot)
    configs = scan.snapshot.configs
    costless = {a.key for a in orphans if costs_nothing(a, records)}
    # As the scan weighed them (reaper.reap.waiting): what the waiting hold counts as the orphans'.
    trust = node_trust((c for c in configs if not c.path.startswith("cache:")), reap.allow_plugins,
                       *held_by_others(scan.snapshot, [*orphans, *waiting]),
                       proven=proven_namespaces(orphans, records), gone_here=scan.gone_here)  # fmt: skip
    selected, skipped = select(orphans, policy, costless)
    skipped = not_reviewed + [SkippedAttachment(a.key, a.reason) for a in waiting] + skipped
    # A costless orphan is files alone, in no namespace: no DEL runs for it (none could, with
    # no pin to pass), and saying why for each of thousands would only fill the log.
    asked = {
        a.key: (None, DROPPED)
        if a.key in dropped
        else (None, None)
        if policy.kernel_only or a.key in costless
        else del_request(a, records, configs, trust)
        for a in selected
    }
    requests = {key: request for key, (request, _) in asked.items()}
    plan = tuple(plan_attachment(a, *asked[a.key], policy.quarantine) for a in selected)
    if reviewed is not None:
        keys = plan_keys(reviewed)
        differs = {p.key: why for p in plan if (why := steps_changed(p, keys)) is not None}
        skipped += [SkippedAttachment(key, f"not as reviewed: {why}") for key, why in differs.items()]
        selected = [a for a in selected if a.key not in differs]
        plan = tuple(p for p in plan if p.key not in differs)
    for key, (_, note) in asked.items():
        if note is not None:
            # No kernel object: a partial ADD's leftovers (a lease, a chain) look so too, so it is news, not a warning.
            level = logging.INFO if note in (NO_KERNEL_EVIDENCE, NO_PIN, NOT_LISTED_HERE, DROPPED) else logging.WARNING
            log.log(level, "plugin config refused", extra={"attachment": key.as_text(), "reason": note})
    if reap.dry_run:
        # The address check reads the kernel only: the plan leaves out what the pass would leave.
        held = addresses_in_use(selected, records, settings.netns_dirs)
        skipped += [SkippedAttachment(a.key, held[a.key]) for a in selected if a.key in held]
        return result(plan=tuple(p for p in plan if p.key not in held), skipped=tuple(skipped))

    if stop.is_set():
        skipped += [SkippedAttachment(a.key, "stopping") for a in selected]
        return result(plan=plan, skipped=tuple(skipped))
    # Before acting, ask the runtimes again (and again before each batch of DELs and of the
    # kernel step): an ID that reappeared, or a netns someone entered, is left alone.
    watch.restart()
    view = liveness.observe(scan.known_netns)
    watch.lap("recheck")
    if not view.reachable:
        skipped += [SkippedAttachment(a.key, UNREACHABLE_AT_RECHECK) for a in selected]
        return result(plan=plan, skipped=tuple(skipped), recheck_error=view.error)
    # Files can split a running container's lease, chain and rules from its namespace; where
    # the kernel has its addresses configured cannot be forged (reaper.reap.addresses).
    held = addresses_in_use(selected, records, settings.netns_dirs)
    if held:
        skipped += [SkippedAttachment(a.key, held[a.key]) for a in selected if a.key in held]
        selected = [a for a in selected if a.key not in held]
        for key, why in held.items():
            log.warning("left: address in use", extra={"attachment": key.as_text(), "reason": why})
    watch.lap("addresses")
    options = find_options(settings)
    reclaimer = Reclaimer(
        look=lambda: take_snapshot(options, memo),
        netns_dirs=settings.netns_dirs,
        bin_dirs=settings.cni_bin_dirs,
        live_netns=frozenset(s.netns for s in view.sandboxes if s.netns is not None),
        plugin_timeout=reap.plugin_timeout,
        del_concurrency=reap.del_concurrency,
        quarantine=Quarantine(reap.quarantine_dir) if reap.quarantine_dir else None,
        log=log,
        stop=stop,
        observe=lambda: liveness.observe(scan.known_netns),
        watch=watch,
        network_configs={c.name: c.raw for c in reversed(configs) if not c.path.startswith("cache:")},
    )
    keep = {
        a.key: what
        for a in selected
        if a.key not in dropped and (what := kept_state(a, records, configs, requests[a.key])) is not None
    }
    # Only a pass with a DEL to run reads the node's iptables backend (four saves at most).
    path_plan = plan_plugin_path(PLUGIN_PATH) if any(r is not None for r in requests.values()) else None
    with plugin_path(path_plan, PLUGIN_PATH, beside=settings.state_file) as given:
        if path_plan is not None:
            _log_plugin_path(log, path_plan, given)
        reclaimer.plugin_path = given.path
        outcomes, left = reclaimer.run(selected, requests, records, keep, scan.snapshot)
    skipped += left
    # A runtime that stopped answering during the pass makes it undecided, as at the first re-check.
    lost = next((s.reason.split(": ", 1)[-1] for s in left if s.reason.startswith(UNREACHABLE_AT_RECHECK)), None)
    judged = {a.key: a for a in selected}
    for outcome in outcomes:
        log.info(
            "reclaimed" if outcome.ok else "reclaim incomplete",
            extra={
                "attachment": outcome.key.as_text(),
                **reclaim_log_fields(judged.get(outcome.key), outcome),
                "resources": ",".join(
                    f"{r.kind}:{r.name}:{r.method}:{'ok' if r.ok else r.error}" for r in outcome.resources
                ),
            },
        )
    return result(plan=plan, reclaimed=tuple(outcomes), skipped=tuple(skipped), recheck_error=lost)
