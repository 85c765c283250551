"""Who is in a namespace is looked for only when it can decide a verdict (some namespace is no
listed sandbox's), and described only where it can: in an attachment's namespace that no listed
sandbox owns (a namespace a sandbox owns is live whoever is in it, and one no attachment is in
decides nothing)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from msgspec.structs import replace

import reaper.snapshot as snapshot_module
from reaper.correlate import correlate, tie_all
from reaper.host import procs
from reaper.host.procs import process_facts
from reaper.model import NodeSnapshot, NsKey, Policy, RuntimeView
from reaper.reconcile import holders_decide, processes_decide, reconcile
from reaper.snapshot import NetnsMembers, with_holders, with_processes
from tests.harness.snapshots import cache, cid, lease, pin, runtime, sandbox, snapshot, veth

POLICY = Policy(min_age=0.0, confirmations=1, stuck_after=900.0)


def test_only_the_wanted_namespaces_processes_are_described() -> None:
    me = os.getpid()
    other, wanted = NsKey(4, 1001), NsKey(4, 1002)
    look = replace(snapshot(), netns_pids=((other, (me,)), (wanted, (me, 2**22 + 7))))
    described = dict(with_holders(look, {wanted}, ()).netns_holders)
    assert list(described) == [wanted]
    mine, gone = described[wanted]
    facts = process_facts(me)
    assert facts is not None
    assert (mine.pid, mine.comm) == (me, facts.comm) and mine.keeps_netns_busy
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
    runtime = RuntimeView(
        endpoint="unix:///x.sock", name="x", version="1", reachable=True, error=None, sandboxes=(sandbox(2),)
    )
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

    def named(look: NodeSnapshot) -> set[NsKey]:
        return tie_all(look).namespaces()

    owned = named(snapshot(pins=(pin(1),), caches=(cache(1),), leases=(lease(1),), veths=(veth(1),)))
    assert owned == {pin(1).ns}
    assert not processes_decide(owned, runtime(live))
    assert processes_decide(named(snapshot(pins=(pin(1), pin(2)))), runtime(live))  # a pin of no sandbox
    assert processes_decide(named(snapshot(pins=(pin(1),), caches=(cache(2),))), runtime(live))  # a cache entry's
    assert processes_decide(owned, runtime())  # no sandbox at all
    assert not processes_decide(owned, runtime(reachable=False))  # every verdict is unknown anyway
    stale = replace(pin(2), is_namespace=False)  # a plain file: no namespace anyone could be in
    assert not processes_decide(named(snapshot(pins=(pin(1), stale))), runtime(live))


def test_the_walk_gives_each_namespace_its_processes_but_the_hosts() -> None:
    """Run in this process's own netns: as the host's, it is left out; as another, it shows
    this process."""
    st = os.stat("/proc/self/ns/net")
    mine = NsKey(st.st_dev, st.st_ino)
    looked = with_processes(replace(snapshot(), host_netns=NsKey(0, 0)))
    assert os.getpid() in dict(looked.netns_pids)[mine]
    assert looked.unseen_processes is None
    as_host = with_processes(replace(snapshot(), host_netns=mine))
    assert mine not in dict(as_host.netns_pids)


def test_a_walk_that_gave_no_answer_leaves_every_process_unseen_and_a_leak_undecided() -> None:
    """A walk that failed on its way: no pin is an orphan on its word."""

    def failed() -> NetnsMembers:
        raise OSError(errno.EIO, "the walk stopped")

    looked = with_processes(snapshot(pins=(pin(1),)), failed)
    assert looked.unseen_processes is not None and "walk of /proc failed" in looked.unseen_processes
    report, _ = reconcile(looked, runtime(), {}, POLICY, 10_000.0)
    assert [a.verdict for a in report.attachments] == ["unknown"]


@pytest.mark.parametrize("proc", ["missing", "empty", "others-only"])
def test_a_walk_of_proc_that_is_not_whole_decides_nothing_a_process_could_keep(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, proc: str
) -> None:
    """/proc unlistable, listing no process, or not this one: the walk fails (never "no one is in
    any namespace"), a pin's attachment is undecided, a failed source says why, and an attachment
    no process could keep (a lease alone) is still judged."""
    root = tmp_path / "proc"
    if proc != "missing":
        root.mkdir()
        (root / "self").mkdir()
    if proc == "others-only":
        (root / "1").mkdir()
    real = procs.netns_members
    monkeypatch.setattr(snapshot_module, "netns_members", lambda: real(str(root)))
    look = snapshot(pins=(pin(1),), leases=(lease(2),))
    looked = with_processes(look)
    assert looked.unseen_processes is not None and "walk of /proc failed" in looked.unseen_processes
    assert [e.source for e in looked.errors] == ["processes"]
    report, _ = reconcile(looked, runtime(), {}, POLICY, 10_000.0)
    verdicts = {a.key.container_id: a.verdict for a in report.attachments}
    assert verdicts == {None: "unknown", cid(2): "orphan"}, report.attachments
    assert report.errors == looked.errors
