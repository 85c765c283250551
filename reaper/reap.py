"""One reclaiming pass: scan, plan, re-check, act (plugin DEL, then the kernel), verify."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from reaper.inventory.memo import InventoryMemo
from reaper.inventory.procs import describe, netns_members
from reaper.inventory.snapshot import take_snapshot
from reaper.liveness import LivenessSource
from reaper.model import (
    Attachment,
    AttachmentKey,
    CacheEntry,
    GcOutcome,
    HostLocalLease,
    IptablesChain,
    NetnsPin,
    NftRule,
    NodeSnapshot,
    NsKey,
    PlannedAttachment,
    PlannedStep,
    ReclaimMethod,
    ReclaimOutcome,
    ResourceOutcome,
    ResourceRef,
    RuntimeView,
    ScanReport,
    SkippedAttachment,
    VethLink,
)
from reaper.reclaim import kernel
from reaper.reclaim.gc_verb import gc_networks
from reaper.reclaim.plugin_del import DelRequest, del_network, request_from_cache, safe_ifname
from reaper.reclaim.quarantine import Quarantine
from reaper.scan import inventory_options, scan_pass
from reaper.settings import ReapSettings, Settings

VETH_GRACE = 2.0  # seconds for the kernel to drop the veths of unpinned namespaces
DEL_WORKERS = min(8, 2 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class ReapResult:
    report: ScanReport
    breaker_open: bool
    breaker_reason: str | None
    plan: tuple[PlannedAttachment, ...]
    reclaimed: tuple[ReclaimOutcome, ...]
    skipped: tuple[SkippedAttachment, ...]
    gc: tuple[GcOutcome, ...]
    recheck_error: str | None  # the runtime could not be asked again right before acting
    timings: tuple[tuple[str, float], ...] = ()  # seconds per step: scan, recheck, del, look, kernel, verify
    state_saved: bool = True


# A resource's identity on the node, the same from one snapshot to the next.
Identity = tuple[str, ...]


def identity(ref: ResourceRef) -> Identity:
    details = dict(ref.details)
    if ref.kind in ("netns", "ipam", "cache"):
        return (ref.kind, str(details.get("path")))
    if ref.kind == "iptables":
        return (ref.kind, str(details.get("family")), str(details.get("backend")), ref.name)
    return (ref.kind, ref.name)


Record = NetnsPin | VethLink | HostLocalLease | CacheEntry | IptablesChain | NftRule


def index_snapshot(snapshot: NodeSnapshot) -> dict[Identity, Record]:
    out: dict[Identity, Record] = {}
    for pin in snapshot.pins:
        out[("netns", pin.path)] = pin
    for veth in snapshot.veths:
        out[("veth", veth.name)] = veth
    for lease in snapshot.leases:
        out[("ipam", lease.path)] = lease
    for entry in snapshot.cache_entries:
        out[("cache", entry.path)] = entry
    for chain in snapshot.chains:
        out[("iptables", chain.family, chain.backend, chain.chain)] = chain
    for rule in snapshot.nft_rules:
        out[("nft", f"{rule.family} {rule.table} {rule.chain} {rule.handle}")] = rule
    return out


def _cache_ref(attachment: Attachment) -> str | None:
    for ref in attachment.resources:
        details = dict(ref.details)
        if ref.kind == "cache" and not details.get("legacy") and not details.get("corrupt"):
            return str(details.get("path"))
    return None


def _pin_path(attachment: Attachment) -> str:
    """CNI_NETNS for DEL: the attachment's pin when it is still a real namespace, else empty."""
    for ref in attachment.resources:
        details = dict(ref.details)
        if ref.kind == "netns" and not details.get("stale"):
            path = str(details.get("path"))
            if os.path.exists(path):
                return path
    return ""


def del_request(attachment: Attachment, snapshot: NodeSnapshot) -> DelRequest | None:
    """What DEL would run for this attachment, or None when there is no config to run it with."""
    key = attachment.key
    if key.container_id is None or key.network is None:
        return None
    ifname = safe_ifname(key.ifname)
    netns = _pin_path(attachment)
    cache_path = _cache_ref(attachment)
    if cache_path is not None and key.ifname is not None:
        request = request_from_cache(cache_path, key.container_id, key.network, key.ifname, netns)
        if request is not None:
            return request
    for config in snapshot.configs:
        if config.name == key.network and not config.path.startswith("cache:"):
            return DelRequest(key.container_id, key.network, ifname, netns, config.raw, config.path)
    return None


def plan_attachment(attachment: Attachment, snapshot: NodeSnapshot, policy: ReapSettings) -> PlannedAttachment:
    request = None if policy.kernel_only else del_request(attachment, snapshot)
    first: ReclaimMethod = "cni-del" if request is not None else "kernel"
    steps = []
    for ref in attachment.resources:
        method: ReclaimMethod = first
        if ref.kind in ("ipam", "cache") and first == "kernel" and policy.quarantine_dir:
            method = "quarantine"
        steps.append(PlannedStep(ref.kind, ref.name, method))
    return PlannedAttachment(attachment.key, request.source if request else None, tuple(steps))


def breaker_trips(orphans: int, attachments: int, max_ratio: float) -> bool:
    """More than `max_ratio` of the node's attachments look orphaned: more likely a wrong
    runtime list than a leak that large."""
    return attachments > 0 and orphans / attachments > max_ratio


def _reappeared(attachment: Attachment, view: RuntimeView) -> str | None:
    ids = {s.id for s in view.sandboxes}
    netns = {s.netns for s in view.sandboxes if s.netns is not None}
    if attachment.key.container_id is not None and attachment.key.container_id in ids:
        return "its sandbox is listed again"
    if attachment.netns is not None and attachment.netns in netns:
        return "its netns belongs to a sandbox listed now"
    return None


def _busy_namespaces(bin_dirs: tuple[str, ...]) -> dict[NsKey, str]:
    """Namespaces some process is in right now (not a plugin of this reaper's), with why."""
    members = netns_members()
    described = describe({pid for pids in members.values() for pid in pids}, bin_dirs)
    busy = {}
    for ns, pids in members.items():
        inside = [described[p] for p in sorted(pids) if described[p].keeps_netns_busy]
        if inside:
            busy[ns] = f"its netns is in use now (pid {inside[0].pid}, {inside[0].comm})"
    return busy


def _cache_still_names(data: bytes, target: kernel.CacheTarget) -> bool:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return target.corrupt  # still as unreadable as when it was judged
    if not isinstance(doc, dict):
        return target.corrupt
    if doc.get("kind") != "cniCacheV1":
        return "cniVersion" in doc  # a legacy bare result: its name is its only identity
    return (doc.get("containerId"), doc.get("networkName"), doc.get("ifName")) == (
        target.container_id,
        target.network,
        target.ifname,
    )


class _Reclaimer:
    """The act and verify steps for a set of orphans the runtime just confirmed are not its own."""

    def __init__(
        self,
        settings: Settings,
        policy: ReapSettings,
        live_netns: set[NsKey],
        log: logging.Logger,
        memo: InventoryMemo | None,
        stop: threading.Event | None = None,
    ) -> None:
        self.stop = stop or threading.Event()
        self.settings = settings
        self.policy = policy
        self.live_netns = live_netns
        self.log = log
        self.memo = memo
        self.quarantine = Quarantine(policy.quarantine_dir) if policy.quarantine_dir else None
        self.timings: list[tuple[str, float]] = []
        self._mark = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.timings.append((name, round(now - self._mark, 6)))
        self._mark = now

    def snapshot(self) -> NodeSnapshot:
        return take_snapshot(inventory_options(self.settings), self.memo)

    def run(self, attachments: list[Attachment], before: NodeSnapshot) -> list[ReclaimOutcome]:
        self._mark = time.monotonic()
        requests = {a.key: (None if self.policy.kernel_only else del_request(a, before)) for a in attachments}
        plugin_errors = self._del_all(attachments, requests)
        self.lap("del")
        after_del = index_snapshot(self.snapshot())
        self.lap("look")
        if self.stop.is_set():
            # Stopping: no new step starts. What DEL freed is reported; the rest waits.
            kernel_done = {i: kernel.Done(False, "interrupted: stopping") for i in after_del}
        else:
            kernel_done = self._kernel(attachments, after_del)
        self.lap("kernel")
        final = index_snapshot(self.snapshot())
        self.lap("verify")
        outcomes = []
        for a in attachments:
            results = []
            for ref in a.resources:
                ident = identity(ref)
                gone = ident not in final or self._replaced(ref, final[ident])
                if ident not in after_del and requests[a.key] is not None:
                    method: ReclaimMethod = "cni-del"
                    error = None
                else:
                    done = kernel_done.get(ident)
                    method = "quarantine" if done is not None and done.quarantined else "kernel"
                    error = done.error if done is not None and not done.ok else None
                if not gone and error is None:
                    error = "still present after reclaiming"
                results.append(ResourceOutcome(ref.kind, ref.name, method, gone, None if gone else error))
            outcomes.append(ReclaimOutcome(a.key, tuple(results), plugin_errors.get(a.key, ())))
        return outcomes

    @staticmethod
    def _replaced(ref: ResourceRef, record: Record) -> bool:
        """A veth name reused by a new link is not the one reclaimed."""
        if ref.kind == "veth" and isinstance(record, VethLink):
            return dict(ref.details).get("ifindex") != record.ifindex
        return False

    def _del_all(
        self, attachments: list[Attachment], requests: dict[AttachmentKey, DelRequest | None]
    ) -> dict[AttachmentKey, tuple[str, ...]]:
        todo = [(a, requests[a.key]) for a in attachments if requests[a.key] is not None]

        def one(item: tuple[Attachment, DelRequest | None]) -> tuple[AttachmentKey, tuple[str, ...]]:
            attachment, request = item
            assert request is not None
            if self.stop.is_set():
                return attachment.key, ()
            outcomes = del_network(request, self.settings.cni_bin_dirs, self.policy.plugin_timeout, self.stop)
            return attachment.key, tuple(o.error for o in outcomes if o.error)

        # Plugins are processes that spend part of their time waiting (host-local's lock, the
        # kernel): two per core keep the cores busy.
        with ThreadPoolExecutor(max_workers=DEL_WORKERS) as pool:
            results = dict(pool.map(one, todo))
        for key, errors in results.items():
            for error in errors:
                self.log.warning("plugin DEL failed", extra={"attachment": key.as_text(), "error": error})
        return results

    def _kernel(self, attachments: list[Attachment], present: dict[Identity, Record]) -> dict[Identity, kernel.Done]:
        done: dict[Identity, kernel.Done] = {}
        left = [
            (a, ref, present[identity(ref)]) for a in attachments for ref in a.resources if identity(ref) in present
        ]

        pins = _of_type(left, NetnsPin)
        pin_done = kernel.unpin_all(
            [kernel.PinTarget(p.path, p.ns, not p.is_namespace) for _, p in pins],
            self.settings.netns_dirs,
            self.live_netns,
            self.settings.cni_bin_dirs,
        )
        done.update({identity(ref): pin_done[p.path] for ref, p in pins})

        veths = _of_type(left, VethLink)
        if veths:
            if pins:
                kernel.wait_links_gone({v.ifindex for _, v in veths}, VETH_GRACE)
            veth_done = kernel.delete_veths([kernel.VethTarget(v.ifindex, v.name, v.peer_netnsid) for _, v in veths])
            done.update({identity(ref): veth_done[v.ifindex] for ref, v in veths})

        leases = _of_type(left, HostLocalLease)
        lease_done = kernel.release_leases(
            [kernel.LeaseTarget(lease.path, lease.container_id, lease.ifname) for _, lease in leases], self.quarantine
        )
        done.update({identity(ref): lease_done[lease.path] for ref, lease in leases})

        chains = _of_type(left, IptablesChain)
        chain_done = kernel.remove_chains(
            [kernel.ChainTarget(c.family, c.table, c.chain, c.backend) for _, c in chains], 30.0
        )
        done.update({identity(ref): chain_done[(c.family, c.backend, c.chain)] for ref, c in chains})

        rules = _of_type(left, NftRule)
        nft_done = kernel.delete_nft_rules(
            [kernel.NftTarget(r.family, r.table, r.chain, r.handle, r.container_id) for _, r in rules], 30.0
        )
        done.update({identity(ref): nft_done[(r.family, r.table, r.chain, r.handle)] for ref, r in rules})

        # The cache entry goes last, and only once everything else of its attachment is gone:
        # it is what a later DEL would need.
        caches: list[tuple[ResourceRef, CacheEntry]] = []
        for a, ref, rec in left:
            if not isinstance(rec, CacheEntry):
                continue
            others = [identity(r) for r in a.resources if r.kind != "cache"]
            if all(done.get(i, kernel.OK).ok for i in others if i in present):
                caches.append((ref, rec))
            else:
                done[identity(ref)] = kernel.Done(False, "kept: other resources of the attachment remain")
        cache_done = kernel.remove_cache_files(
            [kernel.CacheTarget(c.path, c.container_id, c.network, c.ifname, c.corrupt is not None) for _, c in caches],
            self.quarantine,
            _cache_still_names,
        )
        done.update({identity(ref): cache_done[c.path] for ref, c in caches})
        return done


R = TypeVar("R")


def _of_type(left: list[tuple[Attachment, ResourceRef, Record]], cls: type[R]) -> list[tuple[ResourceRef, R]]:
    return [(ref, rec) for _, ref, rec in left if isinstance(rec, cls)]


def reap_pass(
    settings: Settings,
    policy: ReapSettings,
    liveness: LivenessSource,
    log: logging.Logger,
    clock: Callable[[], float] = time.time,
    memo: InventoryMemo | None = None,
    stop: threading.Event | None = None,
) -> ReapResult:
    """One pass. `stop`, once set, lets the step under way finish and starts no new one."""
    started = time.monotonic()
    scan = scan_pass(settings, liveness, log, clock, memo)
    report = scan.report
    timings: list[tuple[str, float]] = [("scan", round(time.monotonic() - started, 6))]

    def result(**changes: Any) -> ReapResult:
        base = ReapResult(report, False, None, (), (), (), (), None, tuple(timings), scan.state_saved)
        return replace(base, **changes)

    if not report.runtime.reachable:
        return result()
    orphans = [a for a in report.attachments if a.verdict == "orphan"]
    if not orphans:
        return result(gc=_gc(settings, policy, report) if policy.cni_gc and not policy.dry_run else ())
    ratio = len(orphans) / len(report.attachments)
    if breaker_trips(len(orphans), len(report.attachments), policy.max_orphan_ratio) and not policy.force:
        reason = (
            f"{len(orphans)} of {len(report.attachments)} attachments ({ratio:.0%}) look orphaned, over "
            f"--max-orphan-ratio {policy.max_orphan_ratio:g}: more likely the runtime's list is wrong than "
            f"the node leaked that much; nothing reclaimed (--force overrides)"
        )
        log.error("breaker open", extra={"orphans": len(orphans), "attachments": len(report.attachments)})
        return result(breaker_open=True, breaker_reason=reason)
    selected, deferred = orphans[: policy.max_reap], orphans[policy.max_reap :]
    skipped = [SkippedAttachment(a.key, f"over --max-reap {policy.max_reap}; next pass") for a in deferred]
    plan = tuple(plan_attachment(a, scan.snapshot, policy) for a in selected)
    if policy.dry_run:
        return result(plan=plan, skipped=tuple(skipped))

    if stop is not None and stop.is_set():
        skipped += [SkippedAttachment(a.key, "stopping") for a in selected]
        return result(plan=plan, skipped=tuple(skipped))
    # Right before acting, ask the runtime again: an ID that reappeared is left alone.
    mark = time.monotonic()
    view = liveness.observe(scan.known_netns)
    timings.append(("recheck", round(time.monotonic() - mark, 6)))
    if not view.reachable:
        skipped += [SkippedAttachment(a.key, "runtime unreachable at the re-check") for a in selected]
        return result(plan=plan, skipped=tuple(skipped), recheck_error=view.error)
    busy = _busy_namespaces(settings.cni_bin_dirs)
    act = []
    for a in selected:
        why = _reappeared(a, view) or (busy.get(a.netns) if a.netns is not None else None)
        if why is None:
            act.append(a)
        else:
            skipped.append(SkippedAttachment(a.key, why))
    live_netns = {s.netns for s in view.sandboxes if s.netns is not None}
    reclaimer = _Reclaimer(settings, policy, live_netns, log, memo, stop)
    outcomes = reclaimer.run(act, scan.snapshot) if act else []
    timings.extend(reclaimer.timings)
    for outcome in outcomes:
        log.info(
            "reclaimed" if outcome.ok else "reclaim incomplete",
            extra={
                "attachment": outcome.key.as_text(),
                "resources": ",".join(
                    f"{r.kind}:{r.name}:{r.method}:{'ok' if r.ok else r.error}" for r in outcome.resources
                ),
            },
        )
    gc = _gc(settings, policy, report) if policy.cni_gc else ()
    return result(plan=plan, reclaimed=tuple(outcomes), skipped=tuple(skipped), gc=gc)


def _live_attachments(report: ScanReport) -> Iterable[tuple[str, str, str]]:
    for a in report.attachments:
        k = a.key
        if a.verdict != "orphan" and k.container_id and k.network and k.ifname:
            yield k.network, k.container_id, k.ifname


def _gc(settings: Settings, policy: ReapSettings, report: ScanReport) -> tuple[GcOutcome, ...]:
    return gc_networks(
        settings.cni_conf_dir, list(_live_attachments(report)), settings.cni_bin_dirs, policy.plugin_timeout
    )
