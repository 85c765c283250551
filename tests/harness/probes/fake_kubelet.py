"""A process that names itself kubelet (PR_SET_NAME), goes into the root given (if any) and
waits to be killed; the flags after its own arguments are what runtime discovery reads. Usage:
fake_kubelet SAY ROOT FLAG...: SAY `say-ready` writes "k" on stdout once it is named (and in
its root), `quiet` writes nothing (its stdout is the reaper's); ROOT is a dir or "". Imports the
standard library alone: the tests run it with interpreters of their own."""

from __future__ import annotations

import ctypes
import os
import sys
import time

PR_SET_NAME = 15


def main(say: str, root: str) -> None:
    ctypes.CDLL(None).prctl(PR_SET_NAME, b"kubelet", 0, 0, 0)
    if root:
        os.chroot(root)
    if say == "say-ready":
        os.write(1, b"k")
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
