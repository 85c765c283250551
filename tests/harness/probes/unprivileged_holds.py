"""uid 65534, in a user and mount namespace of its own, holds a network namespace where the
reaper may not reach it; then the address check and the lease reclaim run over one orphan's
lease (and, for the pod cases, a pod-like namespace's). Usage: unprivileged_holds CASE.

CASE: binfmt_misc (its own netns bound below a binfmt_misc of its user namespace), covered (on
a file a tmpfs then covers), pinned (in a mount namespace of its own pinned on a file, with no
process left in it), reachable (on a file the walk reads), pod / pod-covered (root's pin bound
below its binfmt_misc, or on a file a tmpfs covers, then the pin removed).

Run as root in a mount, network and PID namespace of its own (with its own /proc): that PID
namespace is the node as far as the check is concerned. Prints what was left and freed, as
JSON, or {"attacker_failed": why} when uid 65534 could not make the case."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile

from reaper.kinds import ReclaimContext, hostlocal
from reaper.kinds.hostlocal import HostLocalLease
from reaper.model import Attachment, AttachmentKey, NsKey
from reaper.reap import addresses

# A network namespace of its own with the leak's address, bound on the file named after it.
OWN_NETNS = (
    "unshare -n sh -euc 'ip link set lo up; ip addr add 10.9.0.5/32 dev lo; mount --bind /proc/self/ns/net \"$0\"' "
)
# uid 65534's scripts, each run by `sh -euc SCRIPT sh USER_DIR [POD_PIN]`; each says "ready"
# once its mounts are made, then waits.
ATTACKS = {
    "binfmt_misc": 'mkdir "$1/b"; mount -t binfmt_misc binfmt_misc "$1/b"; '
    + OWN_NETNS
    + '"$1/b/status"; echo ready; exec sleep 600',
    "covered": 'mkdir "$1/c"; touch "$1/c/net"; ' + OWN_NETNS + '"$1/c/net"; '
    'mount -t tmpfs tmpfs "$1/c"; echo ready; exec sleep 600',
    # A mount namespace of its own holding that netns, pinned on a file, then left by its last
    # process: the walk reads it through a child, and no pid can be asked who made it. Bounded
    # waits: for the holder's netns, then for its pin to bind (it may be in the middle of its
    # exec), so a failure says so, never hangs.
    "pinned": 'touch "$1/mnt" "$1/inner"; unshare -m --propagation private sh -eu "$1/holder.sh" "$1" '
    "</dev/null >/dev/null 2>&1 & "
    'child=$!; n=0; while [ ! -e "$1/inner-ready" ]; do '
    '  n=$((n+1)); [ $n -lt 400 ] || { echo "no inner netns" >&2; exit 1; }; sleep 0.05; done; '
    'n=0; until mount --bind /proc/$child/ns/mnt "$1/mnt"; do '
    "  n=$((n+1)); [ $n -lt 100 ] || exit 1; sleep 0.05; done; "
    "kill $child; wait $child || true; "
    "echo ready; exec sleep 600",
    "reachable": 'touch "$1/net"; ' + OWN_NETNS + '"$1/net"; echo ready; exec sleep 600',
    "pod": 'mkdir "$1/b"; mount -t binfmt_misc binfmt_misc "$1/b"; mount --bind "$2" "$1/b/status"; '
    "echo ready; exec sleep 600",
    "pod-covered": 'mkdir "$1/c"; touch "$1/c/net"; mount --bind "$2" "$1/c/net"; '
    'mount -t tmpfs tmpfs "$1/c"; echo ready; exec sleep 600',
}
# The "pinned" case's holder, and the netns it makes inside (files in uid 65534's dir).
HOLDER_SH = 'unshare -n sh -eu "$1/inner.sh" "$1"; touch "$1/inner-ready"; exec sleep 600\n'
INNER_SH = 'ip link set lo up; ip addr add 10.9.0.5/32 dev lo; mount --bind /proc/self/ns/net "$1/inner"\n'

PROCS: list[subprocess.Popen[str]] = []


def no_unseen_processes(proc: str = "/proc") -> str | None:
    """This probe's PID namespace is the node: it is the host's as far as the check is concerned."""
    return None


def kill_procs() -> None:
    for proc in PROCS:
        proc.kill()


def as_nobody(script: str, *args: str) -> subprocess.Popen[str]:
    """uid 65534 in a user and mount namespace of its own, once it says "ready"; exits the probe
    with {"attacker_failed": why} when it cannot."""
    argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    argv += ["unshare", "-Urm", "sh", "-euc", script, "sh", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    PROCS.append(proc)
    assert proc.stdout is not None and proc.stderr is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        print(json.dumps({"attacker_failed": proc.stderr.read().strip()[-300:]}))
        sys.exit(0)
    return proc


def orphan(ipam: str, cid: str, ip: str, netns: NsKey | None) -> tuple[Attachment, HostLocalLease]:
    path = os.path.join(ipam, "net1", ip)
    with open(path, "w") as f:
        f.write(f"{cid}\r\neth0")
    lease = HostLocalLease(
        network="net1",
        ip=ip,
        container_id=cid,
        ifname="eth0",
        path=path,
        data_dir=ipam,
        mtime=os.stat(path).st_mtime,
    )
    attachment = Attachment(
        key=AttachmentKey(cid, "net1", "eth0"),
        resources=(hostlocal.KIND.ref(lease),),
        netns=netns,
        verdict="orphan",
        reason="no sandbox",
        age_seconds=1e6,
    )
    return attachment, lease


def main(case: str) -> None:
    vars(addresses)["unseen_processes"] = no_unseen_processes  # the name the check calls
    atexit.register(kill_procs)
    work = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", work], check=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    pins, ipam, user = (os.path.join(work, d) for d in ("netns", "ipam", "user"))
    for d in (pins, os.path.join(ipam, "net1"), user):
        os.makedirs(d, mode=0o755)
    os.chown(user, 65534, 65534)

    pod_ns = None
    if case.startswith("pod"):
        # A pod's pin made by root; uid 65534 opens it (nsfs files are 0444) and binds it below a
        # binfmt_misc of its own (which the walk reads through), or on a file a tmpfs then covers
        # (which it cannot); then the runtime removes its pin.
        pin = os.path.join(pins, "cni-aaaaaaaa-0000-0000-0000-000000000000")
        open(pin, "w").close()
        inside = "ip link set lo up; ip addr add 10.9.0.7/32 dev lo"
        subprocess.run(["unshare", f"--net={pin}", "sh", "-c", inside], check=True)
        st = os.stat(pin)
        pod_ns = NsKey(st.st_dev, st.st_ino)
        attacker = as_nobody(ATTACKS[case], user, pin)
        subprocess.run(["umount", pin], check=True)
        os.unlink(pin)
    else:
        if case == "pinned":
            with open(os.path.join(user, "inner.sh"), "w") as f:
                f.write(INNER_SH)
            with open(os.path.join(user, "holder.sh"), "w") as f:
                f.write(HOLDER_SH)
        attacker = as_nobody(ATTACKS[case], user)

    made = [orphan(ipam, "d" * 64, "10.9.0.5", None)]
    if pod_ns:
        made.append(orphan(ipam, "e" * 64, "10.9.0.7", pod_ns))
    attachments = [a for a, _ in made]
    leases = {a.key: lease for a, lease in made}
    records = {hostlocal.KIND.identity(leases[a.key]): leases[a.key] for a in attachments}
    left = addresses.addresses_in_use(attachments, records, (pins,))
    ctx = ReclaimContext(
        netns_dirs=(pins,), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=30.0, done={}
    )
    freed = hostlocal.reclaim([leases[a.key] for a in attachments if a.key not in left], ctx)
    with open(f"/proc/{attacker.pid}/mountinfo") as f:
        held = sum(" - nsfs " in line and line.split(" ")[4].startswith(user + "/") for line in f)
    out = {
        "left": {(k.container_id or "")[:1]: why for k, why in left.items()},
        "freed": sorted(done.ok for done in freed.values()),
        "leases": sorted(n for n in os.listdir(os.path.join(ipam, "net1")) if n != "lock"),
        "attacker_running": attacker.poll() is None,
        "attacker_nsfs_mounts": held,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
