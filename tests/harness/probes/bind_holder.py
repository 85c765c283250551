"""Bind-mounts SOURCE (a pinned namespace) onto TARGET in the mount namespace it runs in, as a
process in a container of its own does (containerd#3667, moby#27277, cri-o#4210).

Usage: bind_holder SOURCE TARGET [hold|once|thread].
- hold (the default): says "ready" once mounted, then waits to be killed.
- once: mounts and exits (the mount stays with the mount namespace, if another pins it).
- thread: a thread of its own unshares a mount namespace and mounts there (the process's own is
  left as it was); prints that thread's id, then waits to be killed.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

from tests.harness.lab.kernel import MS_BIND, mount

CLONE_NEWNS = 0x00020000
WAIT = 600.0


def unshare_mounts_of_this_thread() -> None:
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare: {os.strerror(code)}")


def main(source: str, target: str, how: str) -> None:
    if how == "thread":

        def hold() -> None:
            unshare_mounts_of_this_thread()
            mount(source, target, None, MS_BIND)
            print(threading.get_native_id(), flush=True)
            time.sleep(WAIT)

        threading.Thread(target=hold, daemon=True).start()
        time.sleep(WAIT)
        return
    mount(source, target, None, MS_BIND)
    if how == "hold":
        print("ready", flush=True)
        time.sleep(WAIT)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "hold")
