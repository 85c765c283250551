"""Who is in a namespace is looked for only when it can decide a verdict (some namespace is no
listed sandbox's), and described only where it can: in an attachment's namespace that no listed
sandbox owns (a namespace a sandbox owns is live whoever is in it, and one no attachment is in
decides nothing)."""

from __future__ import annotations

import os

from msgspec.structs import replace

from reaper.correlate import correlate
from reaper.host.procs import proc_stat
from reaper.model import NsKey, Policy, RuntimeView
from reaper.reconcile import holders_decide, processes_decide, reconcile
from reaper.snapshot import with_holders, with_processes
from tests.harness.snapshots import cache, lease, pin, runtime, sandbox, snapshot, veth

POLICY = Policy(min_age=0.0, confirmations=1, stuck_after=900.0)


def test_only_the_wanted_namespaces_processes_are_described() -> None:
    me = os.getpid()
    other, wanted = NsKey(4, 1001), NsKey(4, 1002)
    look = replace(snapshot(), netns_pids=((other, (me,)), (wanted, (me, 2**22 + 7))))
    described = dict(with_holders(look, {wanted}, ()).netns_holders)
    assert list(described) == [wanted]
    mine, gone = described[wanted]
    assert (mine.pid, mine.comm) == (me, proc_stat(me, 0.0).comm) and mine.keeps_netns_busy
    assert gone.pid == 2**22 + 7 and gone.keeps_netns_busy  # gone since the look: still counted


def test_only_an_unowned_attachments_namespace_is_described_and_its_holder_keeps_it() -> None:
    """Pins of a leak and of a listed sandbox, and a namespace no record names, each with this
    process inside as far as the look can tell."""
    me = os.getpid()
    leaked, live, nobodys = pin(1), pin(2), NsKey(4, 9999)
    look = replace(
        snapshot(pins=(leaked, live)),
        netns_pids=((leaked.ns, (me,)), (live.ns, (me,)), (nobodys, (me,))),
    )
    runtime = RuntimeView("unix:///x.sock", "x", "1", True, None, (sandbox(2),))
    correlation = correlate(look, runtime)
    wanted = holders_decide(correlation, runtime)
    assert wanted == {leaked.ns}
    report, _ = reconcile(with_holders(look, wanted, ()), runtime, {}, POLICY, 10_000.0, correlation)
    by_pin = {a.resources[0].name: a for a in report.attachments}
    assert by_pin[leaked.name].verdict == "live" and f"pid {me}" in by_pin[leaked.name].reason
    assert by_pin[live.name].verdict == "live" and "sandbox" in by_pin[live.name].reason


def test_processes_are_looked_for_only_when_a_namespace_is_no_listed_sandboxs() -> None:
    """The /proc walk decides nothing on a node whose every namespace is a listed sandbox's."""
    live = sandbox(1)
    owned = snapshot(pins=(pin(1),), caches=(cache(1),), leases=(lease(1),), veths=(veth(1),))
    assert not processes_decide(owned, runtime(live))
    assert processes_decide(snapshot(pins=(pin(1), pin(2))), runtime(live))  # a pin of no sandbox
    assert processes_decide(snapshot(pins=(pin(1),), caches=(cache(2),)), runtime(live))  # a cache entry's
    assert processes_decide(owned, runtime())  # no sandbox at all
    assert not processes_decide(owned, runtime(reachable=False))  # every verdict is unknown anyway
    stale = replace(pin(2), is_namespace=False)  # a plain file: no namespace anyone could be in
    assert not processes_decide(snapshot(pins=(pin(1), stale)), runtime(live))


def test_the_walk_gives_each_pin_its_pids_and_the_namespaces_theirs() -> None:
    """Run in this process's own netns: a pin whose namespace is this process's shows its pid."""
    st = os.stat("/proc/self/ns/net")
    here = replace(pin(1), ns=NsKey(st.st_dev, st.st_ino))
    stale = replace(pin(2), is_namespace=False, ns=NsKey(st.st_dev, st.st_ino))
    looked = with_processes(replace(snapshot(pins=(here, stale)), host_netns=NsKey(0, 0)))
    by_ns = dict(looked.netns_pids)
    assert os.getpid() in by_ns[here.ns]
    walked_here, walked_stale = looked.of("netns")
    assert os.getpid() in walked_here.pids and walked_stale.pids == ()
    assert looked.unseen_processes is None


def test_the_host_netns_processes_are_not_kept() -> None:
    st = os.stat("/proc/self/ns/net")
    looked = with_processes(replace(snapshot(), host_netns=NsKey(st.st_dev, st.st_ino)))
    assert NsKey(st.st_dev, st.st_ino) not in dict(looked.netns_pids)
