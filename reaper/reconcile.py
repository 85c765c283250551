"""Verdicts: which attachments are live, orphaned, pending or unknown, and why. A pure function of
(snapshot, runtime view, history, policy, now): no I/O, no clock."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from msgspec import Struct

from reaper.correlate import Correlation, ResourceGroup, correlate
from reaper.durations import format_duration
from reaper.kinds import cache, heldns
from reaper.model import (
    Attachment,
    AttachmentHistory,
    DetailValue,
    ForeignPin,
    Holder,
    NetworkConfig,
    NodeSnapshot,
    NsKey,
    Owner,
    Policy,
    RuntimeView,
    Sandbox,
    ScanReport,
    StuckSandbox,
    Verdict,
)


class _Owners(Struct, frozen=True):
    host_netns: NsKey
    by_id: Mapping[str, Sandbox]
    by_netns: Mapping[NsKey, Sandbox]
    holders: Mapping[NsKey, tuple[Holder, ...]]
    held: Mapping[NsKey, str]  # namespaces a record holds where the reaper never frees them

    def reason(self, group: ResourceGroup) -> str | None:
        """Why this attachment is live, or None when nothing owns it."""
        if group.netns is not None and group.netns == self.host_netns:
            return "its netns is the host's network namespace"
        if group.uninspectable_netns is not None:
            return f"its netns {group.uninspectable_netns} cannot be inspected; left alone"
        cid = group.key.container_id
        if cid is not None and cid in self.by_id:
            state = "READY" if self.by_id[cid].ready else "NOTREADY"
            return f"sandbox {cid[:12]} is listed ({state})"
        if group.netns is not None:
            if group.netns in self.by_netns:
                return f"its netns belongs to sandbox {self.by_netns[group.netns].id[:12]}"
            if group.netns in self.held:
                return self.held[group.netns]
            inside = [h for h in self.holders.get(group.netns, ()) if h.keeps_netns_busy]
            if inside:
                h = inside[0]
                if h.is_cni_plugin:
                    return f"CNI plugin {h.comm} (pid {h.pid}) runs in its netns: an ADD or DEL in progress"
                return f"pid {h.pid} ({h.comm}) is inside its netns{_also(inside[1:])}"
        return None


def _also(others: list[Holder], shown: int = 5) -> str:
    """The other processes inside, by pid (the first few)."""
    if not others:
        return ""
    pids = ", ".join(str(h.pid) for h in others[:shown])
    return f", and pids {pids}" + (f" and {len(others) - shown} more" if len(others) > shown else "")


def reconcile(
    snapshot: NodeSnapshot,
    runtime: RuntimeView,
    history: Mapping[str, AttachmentHistory],
    policy: Policy,
    now: float,
    correlation: Correlation | None = None,
) -> tuple[ScanReport, dict[str, AttachmentHistory]]:
    """The verdicts. `correlation`: correlate(snapshot, runtime), if the caller made it already."""
    correlation = correlation if correlation is not None else correlate(snapshot, runtime)
    pids = dict(snapshot.netns_pids)
    owners = _Owners(
        snapshot.host_netns,
        {s.id: s for s in runtime.sandboxes},
        {s.netns: s for s in runtime.sandboxes if s.netns is not None},
        dict(snapshot.netns_holders),
        dict(heldns.holds(record) for record in heldns.KIND.records(snapshot)),
    )
    no_gc = gc_disabled_networks(snapshot.configs)
    # The mounts that hold a namespace, not read whole: a namespace may be held unseen.
    unread = heldns.NAME if heldns.NAME in snapshot.partly_read else None
    attachments: list[Attachment] = []
    foreign: list[ForeignPin] = []
    new_history: dict[str, AttachmentHistory] = {}
    for group in correlation.groups:
        if group.foreign:
            pin = group.resources[0]
            holders = len(pids.get(group.netns, ())) if group.netns else 0
            foreign.append(ForeignPin(pin.name, str(pin.details.get("path")), holders))
            continue
        text_key = group.key.as_text()
        previous = history.get(text_key)
        # The history is read from a file others may write: a time after now is now.
        first_seen = min(previous.first_seen, now) if previous is not None else now
        stamps = [r.created_at for r in group.resources if r.created_at is not None]
        age = max(0.0, now - max(stamps)) if stamps else max(0.0, now - first_seen)
        verdict: Verdict
        streak, counted_at = 0, None
        if not runtime.reachable:
            # The why is the runtime's (report.runtime.error), said once, not on every attachment.
            verdict, reason = "unknown", "runtime unreachable"
        else:
            owner = owners.reason(group)
            if owner is not None:
                verdict, reason = "live", owner
            elif group.netns is not None and snapshot.unseen_processes is not None:
                verdict, reason = "unknown", f"{snapshot.unseen_processes}; its netns may be in use"
            elif group.netns is not None and unread is not None:
                verdict, reason = "unknown", f"what holds a netns ({unread}) was not all read; its netns may be held"
            else:
                streak, counted_at, too_soon = _counted(previous, policy, now)
                verdict, reason = _unowned_verdict(age, streak, policy, too_soon)
        pod, made_by = _pod_and_owner(group)
        network = group.key.network
        excluded = None
        if verdict in UNOWNED:
            excluded = no_gc.get(network or "") or policy.exclusions.reason(pod=pod, network=network)
        if excluded is not None:
            # Counted afresh once the exclusion goes: it is then judged as any new attachment.
            verdict, reason, streak, counted_at = "excluded", f"{excluded} (else {verdict}: {reason})", 0, None
        new_history[text_key] = AttachmentHistory(first_seen, streak, counted_at)
        attachments.append(
            Attachment(
                key=group.key,
                resources=group.resources,
                netns=group.netns,
                verdict=verdict,
                reason=reason,
                age_seconds=age,
                owner=made_by,
                pod=pod,
            )
        )

    stuck = []
    # The attachments by container and by namespace, indexed once for all stuck sandboxes.
    by_cid: dict[str, list[int]] = {}
    by_netns: dict[NsKey, list[int]] = {}
    for n, a in enumerate(attachments):
        if a.key.container_id is not None:
            by_cid.setdefault(a.key.container_id, []).append(n)
        if a.netns is not None:
            by_netns.setdefault(a.netns, []).append(n)
    for sandbox in runtime.sandboxes:
        age = now - sandbox.created_at if sandbox.created_at is not None else 0.0
        if sandbox.ready or age < policy.stuck_after:
            continue
        mine = {*by_cid.get(sandbox.id, ()), *(by_netns.get(sandbox.netns, ()) if sandbox.netns is not None else ())}
        held = tuple(r for n in sorted(mine) for r in attachments[n].resources)
        stuck.append(
            StuckSandbox(id=sandbox.id, name=sandbox.name, namespace=sandbox.namespace, age_seconds=age, resources=held)
        )

    report = ScanReport(
        taken_at=snapshot.taken_at,
        runtime=runtime,
        attachments=tuple(attachments),
        stuck_sandboxes=tuple(stuck),
        corrupt=snapshot.corrupt,
        errors=snapshot.errors,
        ranges=snapshot.ranges,
        foreign_pins=tuple(foreign),
        unconfirmed=tuple(correlation.unconfirmed),
        networks=tuple(dict.fromkeys(c.name for c in snapshot.configs if not c.cached)),
    )
    return report, new_history


def gc_disabled_networks(configs: Iterable[NetworkConfig]) -> dict[str, str]:
    """Why each network whose config says `disableGC: true` is kept, by name: "runtimes must not
    call GC for this network configuration list" (containernetworking/cni SPEC.md; libcni/api.go
    GCNetworkList), and the reaper's reclaim is that GC (docs/reference.md). The first config of
    a name decides, as in libcni: the conf dirs' come before cache entries' in the snapshot."""
    first: dict[str, NetworkConfig] = {}
    for config in configs:
        first.setdefault(config.name, config)
    return {
        name: f"excluded: network {name}'s config {config.path} says disableGC: true"
        for name, config in first.items()
        if config.disable_gc
    }


def _carried(previous: AttachmentHistory | None, policy: Policy) -> int:
    """Ownerless passes counted before this one, at most `confirmations - 1`: the count comes
    from a file others may write, so an orphan verdict still needs this pass's own miss."""
    if previous is None:
        return 0
    return max(0, min(previous.orphan_streak, policy.confirmations - 1))


def _counted(previous: AttachmentHistory | None, policy: Policy, now: float) -> tuple[int, float, float | None]:
    """This ownerless pass's streak and when it last rose; and, for a pass less than the spacing
    after the one that last raised it, how long after (else None): such a pass holds the streak
    (never above `confirmations`), so no run, however often made, shortens the grace. A time
    after now is now (docs/design.md, "The state file")."""
    if previous is None or previous.counted_at is None or previous.orphan_streak < 1:
        return _carried(previous, policy) + 1, now, None
    last = min(previous.counted_at, now)
    if now - last >= policy.confirmation_spacing:
        return _carried(previous, policy) + 1, now, None
    return min(previous.orphan_streak, policy.confirmations), last, now - last


def _unowned_verdict(age: float, streak: int, policy: Policy, too_soon: float | None) -> tuple[Verdict, str]:
    if age < policy.min_age:
        return "pending", (
            f"no owner, but younger than min-age ({format_duration(age)} < {format_duration(policy.min_age)})"
        )
    if streak < policy.confirmations:
        held = (
            ""
            if too_soon is None
            else f" (this pass, {format_duration(too_soon)} after the last counted one, counts only "
            f"{format_duration(policy.confirmation_spacing)} after it)"
        )
        return "pending", f"no owner on {streak} of {policy.confirmations} required passes{held}"
    return "orphan", f"no sandbox and no process own it, on {streak} consecutive passes"


UNOWNED: tuple[Verdict, ...] = ("orphan", "pending")  # the verdicts an exclusion takes over


def _pod_and_owner(group: ResourceGroup) -> tuple[str | None, Owner]:
    """The pod ("namespace/name") the attachment's cache entries name, if one; and whose runtime
    made it, by what they say (cri wins over other)."""
    pods: set[str] = set()
    said: set[DetailValue] = set()
    for ref in group.resources:
        pod = ref.details.get("pod")
        if pod is not None:
            pods.add(str(pod))
        if ref.kind == cache.KIND.name:
            said.add(ref.details.get("owner"))
    owner: Owner = "cri" if "cri" in said else "other" if "other" in said else "unknown"
    return (pods.pop() if len(pods) == 1 else None), owner
