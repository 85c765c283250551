"""The address check is bounded in memory whatever a namespace holds (issue 31, point 3).

Beside the check: a namespace uid 65534 made (`unshare -Urn`) with 100,000 addresses, the
orphan's among them, and one root made with as many. The check runs in a process of its own
whose address space (RLIMIT_AS) may grow only a little past what it holds once imported: the
old check, which read every address of every namespace whole, does not fit (it failed with
MemoryError, or died). Now the user's namespace is not read at all (a user without root made
it) and keeps nothing; root's is read message by message, keeping only the orphan's addresses,
and stops at its message bound (lowered here to half the namespace): over it, it is unreadable
and, made by root, leaves the orphan, as a namespace root made that cannot be read always has.

Figures (RSS and time with a million addresses): `bench/hostile_memory.py --addresses`.

It runs as root in a mount, network and PID namespace of its own (with its own /proc): the
node the check sees is the probe's processes and their namespaces; all go with it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.harness.probe import probe_argv
from tests.harness.probes import address_check_memory

FLOOD = Path(__file__).resolve().parents[1] / "harness" / "address_flood.py"
ADDRESSES = 100_000
HEADROOM_MIB = 24  # what the check may add to its address space (the old one needed ~34 MiB more here)


def test_the_address_check_stays_within_its_memory_beside_namespaces_of_100000_addresses() -> None:
    argv = ["unshare", "--mount", "--propagation", "private", "--net", "--pid", "--fork", "--mount-proc"]
    args = [str(FLOOD), str(ADDRESSES), str(HEADROOM_MIB)]
    argv += probe_argv(address_check_memory, *args)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    both, users_only = out["both"], out["users_only"]
    assert both["exit"] == 0 and users_only["exit"] == 0, out
    # Root's namespace over its bound: unreadable, and only root could have made it so.
    (why,) = both["left"]
    assert "over its bound" in why and "cannot be told" in why, out
    # The user's namespace alone, the orphan's address configured there: it keeps nothing.
    assert users_only["left"] == [], out
