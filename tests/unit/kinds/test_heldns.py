"""A namespace a mount holds outside the netns dirs: what it joins, and that it keeps its
attachment live (or undecided, when the mounts could not all be read)."""

from __future__ import annotations

from msgspec.structs import replace

from reaper.host.nsmounts import NsMount
from reaper.kinds import heldns
from reaper.kinds.heldns import HeldNetns
from reaper.model import NodeSnapshot, NsKey, Policy, ScanReport
from reaper.reap.plan import breaker_counts
from reaper.reconcile import reconcile
from tests.harness.snapshots import cache, lease, pin, runtime, snapshot, veth

NOW = 10_000.0
OLD = NOW - 3600.0
POLICY = Policy(min_age=600.0, confirmations=1, stuck_after=900.0)


def held(n: int, pid: int = 4321) -> HeldNetns:
    mount = NsMount(ns=NsKey(4, 1000 + n), pid=pid, mount_ns=4026530000 + n, mount_point=f"/var/held/{n}", on=None)
    return HeldNetns(NsKey(4, 1000 + n), (mount,))


def with_held(snap: NodeSnapshot, *records: HeldNetns) -> NodeSnapshot:
    return replace(snap, resources={**snap.resources, heldns.NAME: records})


def verdicts(report: ScanReport) -> dict[tuple[str, ...], tuple[str, str]]:
    return {tuple(sorted(r.kind for r in a.resources)): (a.verdict, a.reason) for a in report.attachments}


def test_a_held_namespace_keeps_its_pins_attachment_live_with_the_holder() -> None:
    snap = with_held(snapshot(pins=(pin(1, OLD),), veths=(veth(1),)), held(1))
    report, _ = reconcile(snap, runtime(), {}, POLICY, NOW)
    ((attachment,),) = [report.attachments]
    assert {r.kind for r in attachment.resources} == {"netns", "veth", "heldns"}
    assert attachment.verdict == "live"
    assert "pid 4321" in attachment.reason and "/var/held/1" in attachment.reason and "mnt:[" in attachment.reason


def test_a_held_namespace_with_no_pin_joins_its_owner_and_its_veth() -> None:
    """Its pin is gone; the cache entry still names its namespace, and the host veth's peer
    lives there: all of it is one live attachment."""
    snap = with_held(snapshot(veths=(veth(2),), caches=(cache(2, OLD),), leases=(lease(2, OLD),)), held(2))
    report, _ = reconcile(snap, runtime(), {}, POLICY, NOW)
    assert verdicts(report) == {("cache", "heldns", "ipam", "veth"): ("live", heldns.holds(held(2))[1])}


def test_a_held_namespace_nothing_names_stands_alone_only_with_a_host_veth() -> None:
    snap = with_held(snapshot(veths=(veth(3),)), held(3), held(4))  # 4: nobody's, no veth in it
    report, _ = reconcile(snap, runtime(), {}, POLICY, NOW)
    ((attachment,),) = [report.attachments]
    assert attachment.verdict == "live" and {r.kind for r in attachment.resources} == {"veth", "heldns"}
    assert attachment.key.pin == "/proc/4321/root/var/held/3"
    # Any number of namespaces mounted by anyone make no attachment the breaker would weigh.
    crowd = with_held(snapshot(pins=(pin(5, OLD),)), *(held(n) for n in range(10, 200)))
    report, _ = reconcile(crowd, runtime(), {}, POLICY, NOW)
    assert breaker_counts(report.attachments) == (1, 1)


def test_while_the_mounts_cannot_all_be_read_no_attachment_with_a_netns_is_decided() -> None:
    """The safety rule: a walk that was not whole (this kind's error) leaves every namespace
    possibly held, so nothing with a namespace is an orphan; an attachment of files only is
    decided as before."""
    snap = snapshot(pins=(pin(1, OLD),), veths=(veth(1),), leases=(lease(2, OLD),))
    report, _ = reconcile(snap, runtime(), {}, POLICY, NOW)
    assert [a.verdict for a in report.attachments] == ["orphan", "orphan"]
    unread = replace(snap, partly_read=frozenset({heldns.NAME}))
    report, _ = reconcile(unread, runtime(), {}, POLICY, NOW)
    by_netns = {a.netns is not None: (a.verdict, a.reason) for a in report.attachments}
    assert by_netns[True][0] == "unknown" and "heldns" in by_netns[True][1]
    assert by_netns[False][0] == "orphan"


def test_a_held_namespace_is_never_reclaimed() -> None:
    record = held(1)
    done = heldns.reclaim([record], None)  # type: ignore[arg-type]  # it needs no context
    assert not done[heldns.identity(record)].ok and "never unmounted" in str(done[heldns.identity(record)].error)
