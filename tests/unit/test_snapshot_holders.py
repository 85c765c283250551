"""Who is in each namespace is read in the look, before any runtime is asked, and described only
in the namespaces a record ties itself to (one no record names decides no verdict)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from msgspec.structs import replace

import reaper.snapshot as snapshot_module
from reaper.correlate import correlate, tie_all
from reaper.host import procs
from reaper.host.procs import process_facts
from reaper.model import NsKey, Policy, RuntimeView
from reaper.reconcile import reconcile
from reaper.snapshot import NetnsMembers, look_at_node, with_holders, with_processes
from tests.harness.passes import options_at
from tests.harness.snapshots import cid, lease, pin, runtime, sandbox, snapshot

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


def test_a_holder_keeps_a_namespace_no_listed_sandbox_owns() -> None:
    """Pins of a leak and of a listed sandbox, and a namespace no record names, each with this
    process inside as far as the look can tell: the processes of the namespaces the records
    name are described, and the leak's holder keeps its attachment."""
    me = os.getpid()
    leaked, live, nobodys = pin(1), pin(2), NsKey(4, 9999)
    look = replace(
        snapshot(pins=(leaked, live)),
        netns_pids=((leaked.ns, (me,)), (live.ns, (me,)), (nobodys, (me,))),
    )
    named = tie_all(look).namespaces()
    assert named == {leaked.ns, live.ns}
    described = with_holders(look, named, ())
    assert [ns for ns, _ in described.netns_holders] == [leaked.ns, live.ns]
    view = RuntimeView(
        endpoint="unix:///x.sock", name="x", version="1", reachable=True, error=None, sandboxes=(sandbox(2),)
    )
    report, _ = reconcile(described, view, {}, POLICY, 10_000.0, correlate(look, view))
    by_pin = {a.resources[0].name: a for a in report.attachments}
    assert by_pin[leaked.name].verdict == "live" and f"pid {me}" in by_pin[leaked.name].reason
    assert by_pin[live.name].verdict == "live" and "sandbox" in by_pin[live.name].reason


def test_the_look_reads_and_describes_the_processes_before_any_runtime_is_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The pass's look takes no runtime: a namespace a cache entry names (this process's, taken
    as not the host's) has its processes read and described; one no record names has its pids
    read only. Before: the walk waited for the runtimes' answer (look_at_node did not exist)."""
    st = os.stat("/proc/self/ns/net")
    mine, nobodys, me = NsKey(st.st_dev, st.st_ino), NsKey(4, 9999), os.getpid()
    entry = {"kind": "cniCacheV1", "containerId": cid(1), "networkName": "net", "ifName": "eth0",
             "netns": f"/proc/{me}/ns/net", "result": {"cniVersion": "1.0.0"}}  # fmt: skip
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / f"net-{cid(1)}-eth0").write_text(json.dumps(entry))
    monkeypatch.setattr(snapshot_module, "host_netns", lambda: NsKey(0, 0))
    monkeypatch.setattr(snapshot_module, "netns_members", lambda: {mine: {me}, nobodys: {me}})
    looked, ties = look_at_node(options_at(tmp_path))
    assert mine in ties.namespaces() and nobodys not in ties.namespaces()
    assert dict(looked.netns_pids) == {mine: (me,), nobodys: (me,)}
    ((ns, (holder,)),) = looked.netns_holders
    assert ns == mine and holder.pid == me and holder.keeps_netns_busy
    assert {"ties", "processes", "holders"} <= {name for name, _ in looked.timings}


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
