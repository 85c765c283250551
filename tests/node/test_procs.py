"""Namespace membership on a real kernel: a thread that entered a namespace of its own makes its
process a holder of that namespace, though the process's own (main thread's) netns is another."""

from __future__ import annotations

import os
import subprocess

from reaper.host.procs import netns_members
from reaper.model import NsKey
from tests.harness.probe import probe_argv
from tests.harness.probes import thread_in_own_netns


def test_a_thread_in_another_netns_makes_its_process_a_holder_of_it() -> None:
    proc = subprocess.Popen(probe_argv(thread_in_own_netns), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        dev, ino = (int(x) for x in proc.stdout.readline().split())
        members = netns_members()
        st = os.stat(f"/proc/{proc.pid}/ns/net")
        assert proc.pid in members[NsKey(dev, ino)]
        assert proc.pid in members[NsKey(st.st_dev, st.st_ino)]  # the process's own as well
    finally:
        proc.kill()
        proc.wait()
