"""The mount walk of a reaper that has asked a runtime: gRPC's fork handler then starts a thread
in each forked child, so the child that joins a pinned mount namespace shares its filesystem
context with a thread, which the kernel refuses (EINVAL). Usage: walk_after_grpc SOCKET
NETNS_INO: a fake runtime at SOCKET is asked its version, a child forked, then the walk made.
Prints the child's threads and the walk's mounts of the netns NETNS_INO, as JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from reaper.host.nsmounts import held_mounts
from reaper.runtime.client import RuntimeClient
from tests.harness.fake_cri import FakeRuntime, sandbox_list


def main(socket: Path, netns_ino: int) -> None:
    runtime = FakeRuntime(socket, sandbox_list([]), {})
    with RuntimeClient(runtime.endpoint, timeout=10.0) as client:
        client.version()
    pid = os.fork()
    if pid == 0:
        os._exit(min(len(os.listdir(f"/proc/{os.getpid()}/task")), 100))
    threads = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    walk = held_mounts(())  # no netns dir: every mount holds
    mounts = [
        [m.pid, m.mount_ns, m.mount_point] for ns, found in walk.held.items() if ns.ino == netns_ino for m in found
    ]
    print(json.dumps({"child_threads": threads, "mounts": mounts, "unread": list(walk.unread)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
