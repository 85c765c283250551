"""The one-reaper lock on a full disk: a 64 KiB tmpfs mounted at TOP (in the probe's own mount
namespace) and filled, then the lock taken and a second taker refused. Usage: lock_on_full_disk
TOP. Prints the refusal and the lock file's size, as JSON."""

from __future__ import annotations

import json
import os
import sys

from reaper.host.passlock import LockBusy, take_lock
from tests.harness.lab.kernel import mount as kernel_mount


def main(top: str) -> None:
    kernel_mount("tmpfs", top, "tmpfs", 0, "size=64k")
    fd = os.open(f"{top}/filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # full
    state = f"{top}/state.json"
    out: dict[str, object] = {}
    with take_lock(state, 0, "reaper reap"):
        try:
            take_lock(state, 0, "reaper scan")
        except LockBusy as err:
            out["busy"] = str(err)
    out["size"] = os.stat(f"{state}.lock").st_size
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
