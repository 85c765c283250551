"""Unpin one netns pin with the reaper's own reclaim code (reaper.kinds.netns), as a reap pass
would once the pin is an orphan: `python unpin.py NETNS_DIR PIN_NAME`. Prints the outcome as
JSON; exit 0 when the pin was freed.

The systemd test runs it as the shipped service's ExecStart in a copy of that unit, so the
unit's hardening applies to exactly the unmount and unlink a reap pass makes. (A reap pass in
that container calls no pin an orphan: a container has a PID namespace of its own, and the
reaper will not judge a netns while the processes that may hold it are out of sight.)
"""

from __future__ import annotations

import json
import sys

from reaper.kinds import ReclaimContext
from reaper.kinds.netns import collect_pins, identity, reclaim


def main(directory: str, name: str) -> int:
    pins, _ = collect_pins((directory,), ())
    (pin,) = [p for p in pins if p.name == name]
    context = ReclaimContext(
        netns_dirs=(directory,), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=10.0, done={}
    )
    done = reclaim([pin], context)[identity(pin)]
    print(json.dumps({"pin": pin.path, "was_namespace": pin.is_namespace, "ok": done.ok, "error": done.error}))
    return 0 if done.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
