"""A network namespace kept alive by a mount in another mount namespace (containerd#3667,
moby#27277, cri-o#4210), on a real kernel: a process in a mount namespace of its own
bind-mounts a pod's pinned namespace onto a file there, then the pin is removed. The namespace
and its host veth live on, and no pin names them.

Before: the veth's peer was in a namespace the reaper could not name, so the veth joined no
attachment and was not reported at all; a mount made elsewhere after the scan was not seen by
the re-check. Now the mount is found by reading every mount namespace's mountinfo, the
namespace's attachment is live with the holder (pid, mount namespace, mount point) as its
reason, the veth is tied to it, the veth reclaim and the re-check leave it, and its address
keeps the lease split from it; the holder's mount is never touched."""

from __future__ import annotations

from tests.harness.probe import run_probe

PROBE = """
import atexit, json, os, re, subprocess, sys, tempfile, time
from reaper.correlate import correlate
from reaper.host.nsmounts import in_use
from reaper.kinds import FindOptions, ReclaimContext, heldns, hostlocal, netns, veth
from reaper.kinds.hostlocal import HostLocalLease
from reaper.model import Attachment, AttachmentKey, Policy, RuntimeView
from reaper.reap.addresses import addresses_in_use
from reaper.reconcile import reconcile
from reaper.snapshot import take_snapshot

work = tempfile.mkdtemp()
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", work], check=True)
pins = os.path.join(work, "netns")
os.mkdir(pins)
def sh(*argv):
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, (argv[:4], done.stderr)
def pin(name):
    path = os.path.join(pins, name)
    open(path, "w").close()
    sh("unshare", f"--net={path}", "true")
    return path
def key(path):
    st = os.stat(path)
    return [st.st_dev, st.st_ino]

# Bind-mounts argv[1] onto argv[2] in a mount namespace of its own, says so, and waits.
HOLDER = '''
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
if libc.mount(sys.argv[1].encode(), sys.argv[2].encode(), None, ctypes.c_ulong(0x1000), None) != 0:
    raise OSError(ctypes.get_errno(), "mount")
print("ready", flush=True)
time.sleep(600)
'''
holders = []
atexit.register(lambda: [proc.kill() for proc in holders])  # whatever happens, none outlives the probe
def hold(source, target):
    open(target, "w").close()
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", HOLDER, source, target],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    holders.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc

a = pin("cni-aaaaaaaa-0000-0000-0000-000000000000")
b = pin("cni-bbbbbbbb-0000-0000-0000-000000000000")
sh("ip", "link", "add", "ha", "type", "veth", "peer", "name", "eth0", "netns", a)
sh("ip", "link", "add", "hb", "type", "veth", "peer", "name", "eth0", "netns", b)
sh("nsenter", f"--net={a}", "ip", "addr", "add", "10.9.0.2/24", "dev", "eth0")
a_key = key(a)
held = os.path.join(work, "held")
holder = hold(a, held)
# The runtime removes its pin: the namespace lives on, held by the mount in the other namespace.
sh("umount", a)
os.unlink(a)
alive = subprocess.run(["ip", "link", "show", "ha"], capture_output=True).returncode == 0

opts = FindOptions(
    netns_dirs=(pins,), ipam_dirs=(), cache_dir=work, conf_dir=work, bin_dirs=(), netns_patterns=(re.compile("cni-.*"),)
)
nobody = RuntimeView(endpoint="none", name=None, version=None, reachable=True, error=None, sandboxes=())
policy = Policy(min_age=0, confirmations=1, stuck_after=1e9)

def look(kinds):
    snap = take_snapshot(opts, kinds=kinds)
    report, _ = reconcile(snap, nobody, {}, policy, time.time(), correlate(snap, nobody, kinds))
    verdicts = {
        ",".join(sorted(r.name for r in a.resources)): [a.verdict, a.reason] for a in report.attachments
    }
    return snap, verdicts, [e.error for e in snap.errors]

_, before, _ = look((netns.KIND, veth.KIND))  # what the reaper saw without the mount walk
snap, after, errors = look((netns.KIND, heldns.KIND, veth.KIND))
held_records = [r for r in snap.of("heldns") if list(r.ns) in (a_key, key(b))]
veths = {v.name: v for v in snap.of("veth")}
ctx = ReclaimContext(
    netns_dirs=(pins,), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=30.0, done={}
)
reclaim_ha = veth.reclaim([veths["ha"]], ctx)[veth.identity(veths["ha"])]
ha_left = subprocess.run(["ip", "link", "show", "ha"], capture_output=True).returncode == 0
busy_at_scan = {f"{ns.dev}:{ns.ino}": why for ns, why in in_use((), (pins,)).items()}
# The held pod's lease, split from its namespace now that the pin is gone: its address is
# configured in the held namespace, so it stays.
lease = HostLocalLease(
    network="net1", ip="10.9.0.2", container_id="c" * 64, ifname="eth0", path=os.path.join(work, "10.9.0.2"),
    data_dir=work, mtime=0.0,
)
split = Attachment(
    key=AttachmentKey("c" * 64, "net1", "eth0"), resources=(hostlocal.KIND.ref(lease),), netns=None,
    verdict="orphan", reason="", age_seconds=1e6,
)
address_left = addresses_in_use([split], {hostlocal.KIND.identity(lease): lease}, (pins,)).get(split.key)

# After the scan, another process mounts b's namespace in a mount namespace of its own: the
# re-check and the veth reclaim see it.
late = hold(b, os.path.join(work, "held-late"))
busy_late = {f"{ns.dev}:{ns.ino}": why for ns, why in in_use((), (pins,)).items()}
reclaim_hb = veth.reclaim([veths["hb"]], ctx)[veth.identity(veths["hb"])]
hb_left = subprocess.run(["ip", "link", "show", "hb"], capture_output=True).returncode == 0
late.kill(); late.wait()
busy_after_late = {f"{ns.dev}:{ns.ino}": why for ns, why in in_use((), (pins,)).items()}

# A mount namespace no process is in, pinned on a file, holds c's namespace: it is entered to
# be read, and its mount is a holder with no pid.
c = pin("cni-cccccccc-0000-0000-0000-000000000000")
c_key = key(c)
mnt_pin = os.path.join(work, "mnt-pin")
open(mnt_pin, "w").close()
# A mount namespace of its own bound on a file here, then its process gone: no process is in it.
# The kernel refuses the bind (EINVAL) unless the namespace's id is above this one's, and ids
# are handed out per CPU, so a namespace made later may have a lower one: made again until not.
for _ in range(2000):
    empty = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
    holders.append(empty)
    while os.stat(f"/proc/{empty.pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino:
        time.sleep(0.001)  # until unshare has made its namespace
    bound = subprocess.run(["mount", "--bind", f"/proc/{empty.pid}/ns/mnt", mnt_pin], capture_output=True)
    if bound.returncode == 0:
        break
    empty.kill()
    empty.wait()
assert bound.returncode == 0, bound.stderr
# In it, c's namespace is bound on a file; then the last process in it goes.
BIND = HOLDER.replace('print("ready", flush=True)', "").replace("time.sleep(600)", "")
open(os.path.join(work, "held-c"), "w").close()
sh("nsenter", f"--mount={mnt_pin}", sys.executable, "-c", BIND, c, os.path.join(work, "held-c"))
empty.kill()
empty.wait()
sh("umount", c)
os.unlink(c)
busy_pinned = {f"{ns.dev}:{ns.ino}": why for ns, why in in_use((), (pins,)).items()}
mnt_pin_ino = os.stat(mnt_pin).st_ino

# One thread of a process with a mount namespace of its own (its process's is the probe's)
# holds d's namespace: the walk reads every thread's.
THREAD_HOLDER = '''
import ctypes, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def hold():
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS, this thread only
        raise OSError(ctypes.get_errno(), "unshare")
    if libc.mount(sys.argv[1].encode(), sys.argv[2].encode(), None, ctypes.c_ulong(0x1000), None) != 0:
        raise OSError(ctypes.get_errno(), "mount")
    print(threading.get_native_id(), flush=True)
    time.sleep(600)
threading.Thread(target=hold, daemon=True).start()
time.sleep(600)
'''
d = pin("cni-dddddddd-0000-0000-0000-000000000000")
d_key = key(d)
open(os.path.join(work, "held-d"), "w").close()
threaded = subprocess.Popen(
    [sys.executable, "-c", THREAD_HOLDER, d, os.path.join(work, "held-d")],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
)
holders.append(threaded)
assert threaded.stdout is not None
holding_thread = int(threaded.stdout.readline())
sh("umount", d)
os.unlink(d)
busy_thread = {f"{ns.dev}:{ns.ino}": why for ns, why in in_use((), (pins,)).items()}

with open(f"/proc/{holder.pid}/mountinfo") as f:
    holders_mount = any(line.split(" ")[4] == held for line in f)
reach = os.stat(f"/proc/{holder.pid}/root{held}")
holder_mnt = os.stat(f"/proc/{holder.pid}/ns/mnt").st_ino
holder.kill(); holder.wait()
print(json.dumps({
    "alive": alive, "before": before, "after": after, "errors": errors,
    "held": [[list(r.ns), [[m.pid, m.mount_ns, m.mount_point] for m in r.mounts]] for r in held_records],
    "a": a_key, "b": key(b), "reach": [reach.st_dev, reach.st_ino], "holder": holder.pid, "holder_mnt": holder_mnt,
    "late": late.pid, "held_path": held,
    "ha_peer": list(veths["ha"].peer_netns or []), "reclaim_ha": [reclaim_ha.ok, reclaim_ha.error], "ha_left": ha_left,
    "reclaim_hb": [reclaim_hb.ok, reclaim_hb.error], "hb_left": hb_left,
    "busy_at_scan": busy_at_scan, "busy_late": busy_late, "busy_after_late": busy_after_late,
    "holders_mount": holders_mount, "address_left": address_left,
    "c": c_key, "busy_pinned": busy_pinned, "mnt_pin": mnt_pin_ino,
    "d": d_key, "busy_thread": busy_thread, "threaded": threaded.pid, "holding_thread": holding_thread,
}))
"""


def test_a_namespace_held_by_a_mount_in_another_mount_namespace_keeps_its_veth() -> None:
    out = run_probe(PROBE)
    assert out["alive"], "the veth died with the pin: the mount did not hold the namespace; the test proves nothing"
    a, b = f"{out['a'][0]}:{out['a'][1]}", f"{out['b'][0]}:{out['b'][1]}"
    # Before: the veth of the held namespace is in no attachment at all.
    assert "ha" not in {name for names in out["before"] for name in names.split(",")}
    # The mount's namespace key is the one stat() gives, through the holder's root as for the pin.
    assert out["errors"] == []
    assert out["held"] == [[out["a"], [[out["holder"], out["holder_mnt"], out["held_path"]]]]]
    assert out["reach"] == out["a"] and out["ha_peer"] == out["a"]
    # Now: the veth is tied to the held namespace, live, with the holder as the reason.
    verdict, reason = out["after"][f"ha,net:[{out['a'][1]}]"]
    assert verdict == "live"
    assert f"pid {out['holder']}" in reason and f"mnt:[{out['holder_mnt']}]" in reason and out["held_path"] in reason
    # A pinned namespace nothing else holds is still an orphan: the rule is about the mount.
    assert out["after"]["cni-bbbbbbbb-0000-0000-0000-000000000000,hb"][0] == "orphan", out["after"]
    # The veth reclaim leaves the held namespace's veth, and the holder's mount is untouched.
    assert out["reclaim_ha"][0] is False and f"pid {out['holder']}" in out["reclaim_ha"][1]
    assert out["ha_left"] and out["holders_mount"]
    # The pod's address, configured in the held namespace, keeps its lease.
    assert "10.9.0.2" in out["address_left"] and f"pid {out['holder']}" in out["address_left"]
    # The re-check: held at the scan, and a mount made after the scan keeps b; gone with it.
    assert a in out["busy_at_scan"] and b not in out["busy_at_scan"]
    assert f"pid {out['late']}" in out["busy_late"][b]
    assert out["reclaim_hb"][0] is False and out["hb_left"]
    assert b not in out["busy_after_late"]
    # A mount namespace with no process in it, pinned on a file, is read too.
    held_c = out["busy_pinned"][f"{out['c'][0]}:{out['c'][1]}"]
    assert f"mnt:[{out['mnt_pin']}]" in held_c and "held-c" in held_c and "no process in it" in held_c
    # A thread with a mount namespace of its own is read too.
    assert out["holding_thread"] != out["threaded"]
    held_d = out["busy_thread"][f"{out['d'][0]}:{out['d'][1]}"]
    assert f"pid {out['holding_thread']}" in held_d and "held-d" in held_d
