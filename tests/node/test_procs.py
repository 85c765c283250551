"""Namespace membership on a real kernel: a thread that entered a namespace of its own makes its
process a holder of that namespace, though the process's own (main thread's) netns is another."""

from __future__ import annotations

import os
import subprocess
import sys

from reaper.host.procs import netns_members
from reaper.model import NsKey

# A process whose second thread unshares a network namespace of its own, then sleeps.
THREAD_IN_ITS_OWN_NETNS = """
import ctypes, threading, time, os, sys
def run():
    assert ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0  # CLONE_NEWNET, this thread only
    st = os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net")
    print(st.st_dev, st.st_ino, flush=True)
    time.sleep(60)
threading.Thread(target=run, daemon=True).start()
time.sleep(60)
"""


def test_a_thread_in_another_netns_makes_its_process_a_holder_of_it() -> None:
    proc = subprocess.Popen([sys.executable, "-c", THREAD_IN_ITS_OWN_NETNS], stdout=subprocess.PIPE, text=True)
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
