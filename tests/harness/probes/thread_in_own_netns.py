"""A process whose second thread unshares a network namespace of its own: prints that
namespace's device and inode ("DEV INO"), then waits to be killed."""

from __future__ import annotations

import ctypes
import os
import threading
import time

CLONE_NEWNET = 0x40000000
WAIT = 60.0


def main() -> None:
    def run() -> None:
        if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:  # this thread only
            code = ctypes.get_errno()
            raise OSError(code, f"unshare: {os.strerror(code)}")
        st = os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net")
        print(st.st_dev, st.st_ino, flush=True)
        time.sleep(WAIT)

    threading.Thread(target=run, daemon=True).start()
    time.sleep(WAIT)


if __name__ == "__main__":
    main()
