"""The CRI client's look at one runtime, in a process of its own so that its peak memory is its
own (VmHWM: the peak since its exec; getrusage's ru_maxrss keeps the forked parent's across
the exec). Usage: cri_observe ENDPOINT. Prints what it saw and its peak, as JSON."""

from __future__ import annotations

import json
import sys

from reaper.runtime.cri import CriLiveness


def peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def main(endpoint: str) -> None:
    view = CriLiveness((endpoint,), 20.0).observe({})
    out = {
        "reachable": view.reachable,
        "error": view.error,
        "listed": [a.sandboxes for a in view.runtimes],
        "peak_kib": peak_kib(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
