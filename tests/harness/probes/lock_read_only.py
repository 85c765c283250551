"""The one-reaper lock where the state dir is read-only: TOP bind-mounted read-only on itself
(in the probe's own mount namespace), then a scan's lock and a reap's taken there. Usage:
lock_read_only TOP. Prints whether the scan held it, its warnings and the reap's refusal, as
JSON."""

from __future__ import annotations

import json
import logging
import sys

from reaper.host.passlock import LockUnusable, pass_lock
from tests.harness.lab.kernel import mount as kernel_mount

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096


class Kept(logging.Handler):
    """Keeps each record's message."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(top: str) -> None:
    kernel_mount(top, top, None, MS_BIND)
    kernel_mount(None, top, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    log = logging.getLogger("probe")
    warned = Kept()
    log.addHandler(warned)
    out: dict[str, object] = {}
    with pass_lock(f"{top}/state.json", 0, log, changes_node=False) as lock:
        out["scan_held"] = lock.held
    out["scan_warned"] = warned.messages
    try:
        pass_lock(f"{top}/state.json", 0, log, changes_node=True)
    except LockUnusable as err:
        out["reap"] = str(err)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
