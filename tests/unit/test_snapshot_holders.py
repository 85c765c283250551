"""Who is in a namespace is described only where it can decide a verdict: in an attachment's
namespace that no listed sandbox owns (a namespace a sandbox owns is live whoever is in it,
and one no attachment is in decides nothing)."""

from __future__ import annotations

import os

from msgspec.structs import replace

from reaper.correlate import correlate
from reaper.host.procs import proc_stat
from reaper.model import NsKey, Policy, RuntimeView
from reaper.reconcile import holders_decide, reconcile
from reaper.snapshot import with_holders
from tests.harness.snapshots import pin, sandbox, snapshot

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
