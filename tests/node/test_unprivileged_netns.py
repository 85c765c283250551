"""What a user without root can make keeps only what it could really hold (issue 31, 2(A), 2(C)).

uid 65534, with unprivileged user namespaces (`unshare -Urm` under setpriv), makes network
namespaces of its own and holds them by mounts in its own mount namespace where the reaper
cannot reach them: below a `binfmt_misc` mounted in its user namespace (Linux 6.7 on), or on a
file whose dir a tmpfs then covers. Before, each was a namespace that "could not be read", and
every orphan holding an address was left for as long as the user kept the mount; one it could
reach, with the orphan's address configured, kept that orphan the same way. Now a namespace a
user without root made is not read and keeps nothing: the orphan's lease is freed while the
attacker's mount is held. A pod-like namespace (made by root) that such a user bind-mounted,
its pin then removed, may still be a pod's: unreadable, it keeps only its own attachment.

Each probe runs as root in a mount, network and PID namespace of its own (with its own /proc):
the node the address check sees is the probe's processes and their namespaces, nothing of the
machine's; every namespace, mount and process goes with it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import atexit, json, os, subprocess, sys, tempfile
from reaper.kinds import ReclaimContext, hostlocal
from reaper.kinds.hostlocal import HostLocalLease
from reaper.model import Attachment, AttachmentKey, NsKey
from reaper.reap import addresses

# This probe's PID namespace is the node: it is the host's as far as the check is concerned.
addresses.unseen_processes = lambda: None
case = sys.argv[1]
work = tempfile.mkdtemp()
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", work], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
pins, ipam, user = (os.path.join(work, d) for d in ("netns", "ipam", "user"))
for d in (pins, os.path.join(ipam, "net1"), user):
    os.makedirs(d, mode=0o755)
os.chown(user, 65534, 65534)
procs = []
atexit.register(lambda: [p.kill() for p in procs])

def as_nobody(script, *args):
    # uid 65534 in a user and mount namespace of its own; says "ready" once its mounts are made.
    argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
            "unshare", "-Urm", "sh", "-euc", script, "sh", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        print(json.dumps({"attacker_failed": proc.stderr.read().strip()[-300:]}))
        sys.exit(0)
    return proc

# A network namespace of its own with the leak's address, bound on the file named after it.
OWN_NETNS = ("unshare -n sh -euc 'ip link set lo up; ip addr add 10.9.0.5/32 dev lo; "
             "mount --bind /proc/self/ns/net \"$0\"' ")
if case == "binfmt_misc":
    attacker = as_nobody('mkdir "$1/b"; mount -t binfmt_misc binfmt_misc "$1/b"; '
                         + OWN_NETNS + '"$1/b/status"; echo ready; exec sleep 600', user)
elif case == "covered":
    attacker = as_nobody('mkdir "$1/c"; touch "$1/c/net"; ' + OWN_NETNS + '"$1/c/net"; '
                         'mount -t tmpfs tmpfs "$1/c"; echo ready; exec sleep 600', user)
elif case == "pinned":
    # A mount namespace of its own holding that netns, pinned on a file, then left by its last
    # process: the walk reads it through a child, and no pid can be asked who made it.
    with open(os.path.join(user, "inner.sh"), "w") as f:
        f.write('ip link set lo up; ip addr add 10.9.0.5/32 dev lo; mount --bind /proc/self/ns/net "$1/inner"\n')
    with open(os.path.join(user, "holder.sh"), "w") as f:
        f.write('unshare -n sh -eu "$1/inner.sh" "$1"; touch "$1/inner-ready"; exec sleep 600\n')
    attacker = as_nobody('touch "$1/mnt" "$1/inner"; unshare -m --propagation private sh -eu "$1/holder.sh" "$1" '
                         '</dev/null >/dev/null 2>&1 & '
                         # Bounded waits: for the holder's netns, then for its pin to bind (it
                         # may be in the middle of its exec), so a failure says so, never hangs.
                         'child=$!; n=0; while [ ! -e "$1/inner-ready" ]; do '
                         '  n=$((n+1)); [ $n -lt 400 ] || { echo "no inner netns" >&2; exit 1; }; sleep 0.05; done; '
                         'n=0; until mount --bind /proc/$child/ns/mnt "$1/mnt"; do '
                         '  n=$((n+1)); [ $n -lt 100 ] || exit 1; sleep 0.05; done; '
                         'kill $child; wait $child || true; '
                         'echo ready; exec sleep 600', user)
elif case == "reachable":
    attacker = as_nobody('touch "$1/net"; ' + OWN_NETNS + '"$1/net"; echo ready; exec sleep 600', user)

pod_ns = None
if case.startswith("pod"):
    # A pod's pin made by root; uid 65534 opens it (nsfs files are 0444) and binds it below a
    # binfmt_misc of its own (which the walk reads through), or on a file a tmpfs then covers
    # (which it cannot); then the runtime removes its pin.
    pin = os.path.join(pins, "cni-aaaaaaaa-0000-0000-0000-000000000000")
    open(pin, "w").close()
    subprocess.run(["unshare", f"--net={pin}", "sh", "-c", "ip link set lo up; ip addr add 10.9.0.7/32 dev lo"],
                   check=True)
    st = os.stat(pin)
    pod_ns = NsKey(st.st_dev, st.st_ino)
    if case == "pod":
        attacker = as_nobody('mkdir "$1/b"; mount -t binfmt_misc binfmt_misc "$1/b"; mount --bind "$2" "$1/b/status"; '
                             'echo ready; exec sleep 600', user, pin)
    else:
        attacker = as_nobody('mkdir "$1/c"; touch "$1/c/net"; mount --bind "$2" "$1/c/net"; '
                             'mount -t tmpfs tmpfs "$1/c"; echo ready; exec sleep 600', user, pin)
    subprocess.run(["umount", pin], check=True)
    os.unlink(pin)

def orphan(cid, ip, netns):
    path = os.path.join(ipam, "net1", ip)
    with open(path, "w") as f:
        f.write(f"{cid}\r\neth0")
    lease = HostLocalLease(network="net1", ip=ip, container_id=cid, ifname="eth0", path=path, data_dir=ipam,
                           mtime=os.stat(path).st_mtime)
    attachment = Attachment(key=AttachmentKey(cid, "net1", "eth0"), resources=(hostlocal.KIND.ref(lease),),
                            netns=netns, verdict="orphan", reason="no sandbox", age_seconds=1e6)
    return attachment, lease

made = [orphan("d" * 64, "10.9.0.5", None)] + ([orphan("e" * 64, "10.9.0.7", pod_ns)] if pod_ns else [])
attachments = [a for a, _ in made]
leases = {a.key: lease for a, lease in made}
records = {hostlocal.KIND.identity(leases[a.key]): leases[a.key] for a in attachments}
left = addresses.addresses_in_use(attachments, records, (pins,))
ctx = ReclaimContext(netns_dirs=(pins,), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=30.0,
                     done={})
freed = hostlocal.reclaim([leases[a.key] for a in attachments if a.key not in left], ctx)
with open(f"/proc/{attacker.pid}/mountinfo") as f:
    held = sum(" - nsfs " in line and line.split(" ")[4].startswith(user + "/") for line in f)
print(json.dumps({
    "left": {k.container_id[:1]: why for k, why in left.items()},
    "freed": sorted(done.ok for done in freed.values()),
    "leases": sorted(n for n in os.listdir(os.path.join(ipam, "net1")) if n != "lock"),
    "attacker_running": attacker.poll() is None,
    "attacker_nsfs_mounts": held,
}))
"""


def run(case: str) -> dict[str, object]:
    argv = ["unshare", "--mount", "--propagation", "private", "--net", "--pid", "--fork", "--mount-proc"]
    proc = subprocess.run([*argv, sys.executable, "-c", PROBE, case], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    if "attacker_failed" in out:
        if case not in ("binfmt_misc", "pod"):
            pytest.fail(f"uid 65534 could not make the case: {out['attacker_failed']}")
        pytest.skip(f"this kernel does not let uid 65534 do it: {out['attacker_failed']}")
    return out


@pytest.mark.parametrize("case", ["binfmt_misc", "covered", "pinned", "reachable"])
def test_a_users_own_netns_held_where_the_reaper_cannot_reach_keeps_no_orphan(case: str) -> None:
    """2(A) below binfmt_misc, 2(C) under a tmpfs, in a mount namespace of its own pinned with no
    process in it (2(B)'s way of hiding from a pid), and one reachable with the leak's address
    configured: the leak's lease is freed while the attacker's mount is held."""
    out = run(case)
    assert out["attacker_running"] is True and out["attacker_nsfs_mounts"] == 1, out
    assert out["left"] == {}, out
    assert out["freed"] == [True] and out["leases"] == [], out


@pytest.mark.parametrize("case", ["pod", "pod-covered"])
def test_a_pod_like_netns_only_a_users_mount_holds_keeps_only_its_own_attachment(case: str) -> None:
    """Root's pin, bind-mounted by uid 65534 (below its binfmt_misc, or under a tmpfs it then
    mounts over the file), the pin then removed: the namespace may be a pod's and outlives the
    pass. Read, its own address there keeps its lease; unreadable, whether it still holds it
    cannot be told. Either way only its own attachment stays: the other orphan's lease is freed."""
    out = run(case)
    assert out["attacker_running"] is True and out["attacker_nsfs_mounts"] == 1, out
    left = out["left"]
    assert isinstance(left, dict) and list(left) == ["e"], out
    if case == "pod":
        assert "10.9.0.7 is still configured in its own namespace" in left["e"] and "b/status" in left["e"], left
    else:
        assert "its own namespace" in left["e"] and "uid 65534" in left["e"] and "could not be read" in left["e"], left
    assert out["freed"] == [True] and out["leases"] == ["10.9.0.7"], out
