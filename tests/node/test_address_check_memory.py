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
import sys
from pathlib import Path

FLOOD = Path(__file__).resolve().parents[1] / "harness" / "address_flood.py"
ADDRESSES = 100_000
HEADROOM_MIB = 24  # what the check may add to its address space (the old one needed ~34 MiB more here)

PROBE = r"""
import atexit, json, os, subprocess, sys
flood, count, headroom = sys.argv[1], sys.argv[2], int(sys.argv[3])
procs = []
atexit.register(lambda: [p.kill() for p in procs])

def start(argv):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout.readline().strip() == "ready", argv
    return proc

subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "unshare", "-Urn"]
start([*nobody, "python3", flood, count, "10.9.0.0"])  # the orphan's 10.9.0.5 among them
roots = start(["unshare", "-n", "python3", flood, count, "11.0.0.0"])

CHECK = '''
import json, os, resource, sys, time
from reaper.host import netns_addrs
from reaper.kinds import hostlocal
from reaper.kinds.hostlocal import HostLocalLease
from reaper.model import Attachment, AttachmentKey
from reaper.reap import addresses

addresses.unseen_processes = lambda: None  # this PID namespace is the node
netns_addrs.MAX_ADDRESS_MESSAGES = int(sys.argv[1]) // 2
lease = HostLocalLease(network="net1", ip="10.9.0.5", container_id="d" * 64, ifname="eth0", path="/nonexistent",
                       data_dir="/nonexistent", mtime=0.0)
orphan = Attachment(key=AttachmentKey("d" * 64, "net1", "eth0"), resources=(hostlocal.KIND.ref(lease),), netns=None,
                    verdict="orphan", reason="", age_seconds=1e6)
records = {hostlocal.KIND.identity(lease): lease}
addresses.addresses_in_use([orphan], records, ("/nonexistent",), deadline=0.0)  # everything loaded once
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[2]) * 1024 * 1024, resource.RLIM_INFINITY))
left = addresses.addresses_in_use([orphan], records, ("/nonexistent",), deadline=120.0)
print(json.dumps({"left": list(left.values())}))
'''

def check():
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}  # no 64 MiB arena reserved for the reader thread
    done = subprocess.run([sys.executable, "-c", CHECK, count, str(headroom)], capture_output=True, text=True,
                          env=env, timeout=600)
    if done.returncode != 0:
        return {"exit": done.returncode, "stderr": done.stderr.strip()[-400:]}
    return {"exit": 0, **json.loads(done.stdout)}

both = check()
roots.kill()
roots.wait()
users_only = check()
print(json.dumps({"both": both, "users_only": users_only}))
"""


def test_the_address_check_stays_within_its_memory_beside_namespaces_of_100000_addresses() -> None:
    argv = ["unshare", "--mount", "--propagation", "private", "--net", "--pid", "--fork", "--mount-proc"]
    args = [str(FLOOD), str(ADDRESSES), str(HEADROOM_MIB)]
    proc = subprocess.run([*argv, sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    both, users_only = out["both"], out["users_only"]
    assert both["exit"] == 0 and users_only["exit"] == 0, out
    # Root's namespace over its bound: unreadable, and only root could have made it so.
    (why,) = both["left"]
    assert "over its bound" in why and "cannot be told" in why, out
    # The user's namespace alone, the orphan's address configured there: it keeps nothing.
    assert users_only["left"] == [], out
