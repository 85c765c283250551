"""Who is in a namespace is described only where it can decide a verdict: in the namespaces no
listed sandbox owns (a namespace a sandbox owns is live whoever is in it)."""

from __future__ import annotations

import os

from msgspec.structs import replace

from reaper.host.procs import proc_stat
from reaper.model import NsKey
from reaper.snapshot import with_holders
from tests.harness.snapshots import snapshot


def test_only_the_processes_in_namespaces_no_sandbox_owns_are_described() -> None:
    me = os.getpid()
    owned, unowned = NsKey(4, 1001), NsKey(4, 1002)
    look = replace(snapshot(), netns_pids=((owned, (me,)), (unowned, (me, 2**22 + 7))))
    described = dict(with_holders(look, {owned}, ()).netns_holders)
    assert list(described) == [unowned]
    mine, gone = described[unowned]
    assert (mine.pid, mine.comm) == (me, proc_stat(me, 0.0).comm) and mine.keeps_netns_busy
    assert gone.pid == 2**22 + 7 and gone.keeps_netns_busy  # gone since the look: still counted
    # With no sandbox listed (a runtime that did not answer), every namespace is described.
    assert set(dict(with_holders(look, set(), ()).netns_holders)) == {owned, unowned}
