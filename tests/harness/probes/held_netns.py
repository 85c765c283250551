"""Network namespaces kept alive by mounts in other mount namespaces, on a real kernel, and what
the look, the veth reclaim, the address check and the re-check make of them. Run in a private
mount and network namespace (pins, veths, mounts vanish with it); prints what each saw, as JSON.

a: pinned, a veth into it, bind-mounted by a holder in a mount namespace of its own, then its pin
removed. b: pinned, held by a mount made only after the scan. c: held by a mount in a mount
namespace no process is in, pinned on a file. d: held by one thread's mount namespace."""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import tempfile
import time
from typing import Any

from reaper.correlate import correlate
from reaper.host.nsmounts import in_use
from reaper.kinds import Kind, ReclaimContext, heldns, hostlocal, netns, veth
from reaper.kinds.hostlocal import HostLocalLease
from reaper.kinds.registry import Registry
from reaper.model import Attachment, AttachmentKey, NodeSnapshot, Policy, RuntimeView
from reaper.options import FindOptions
from reaper.reap.addresses import addresses_in_use
from reaper.reconcile import reconcile
from reaper.snapshot import take_snapshot
from tests.harness.probe import probe_argv
from tests.harness.probes import bind_holder

HOLDERS: list[subprocess.Popen[str]] = []


def kill_holders() -> None:
    for proc in HOLDERS:
        proc.kill()


def sh(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, (argv[:4], done.stderr)


def pin(pins: str, name: str) -> str:
    path = os.path.join(pins, name)
    open(path, "w").close()
    sh("unshare", f"--net={path}", "true")
    return path


def key(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino]


def hold(source: str, target: str) -> subprocess.Popen[str]:
    """A holder in a mount namespace of its own with `source` bound on `target`, once it says so."""
    open(target, "w").close()
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", *probe_argv(bind_holder, source, target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    HOLDERS.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def busy(pins: str) -> dict[str, str]:
    """The re-check's namespaces in use, by "dev:ino"."""
    return {f"{ns.dev}:{ns.ino}": why for ns, why in in_use((), (pins,)).items()}


def link_left(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode == 0


def main() -> None:
    atexit.register(kill_holders)  # whatever happens, none outlives the probe
    work = tempfile.mkdtemp()
    sh("mount", "-t", "tmpfs", "tmpfs", work)
    pins = os.path.join(work, "netns")
    os.mkdir(pins)

    a = pin(pins, "cni-aaaaaaaa-0000-0000-0000-000000000000")
    b = pin(pins, "cni-bbbbbbbb-0000-0000-0000-000000000000")
    sh("ip", "link", "add", "ha", "type", "veth", "peer", "name", "eth0", "netns", a)
    sh("ip", "link", "add", "hb", "type", "veth", "peer", "name", "eth0", "netns", b)
    sh("nsenter", f"--net={a}", "ip", "addr", "add", "10.9.0.2/24", "dev", "eth0")
    a_key = key(a)
    held = os.path.join(work, "held")
    holder = hold(a, held)
    # The runtime removes its pin: the namespace lives on, held by the mount in the other namespace.
    sh("umount", a)
    os.unlink(a)
    alive = link_left("ha")

    opts = FindOptions(
        netns_dirs=(pins,),
        ipam_dirs=(),
        cache_dir=work,
        conf_dir=work,
        bin_dirs=(),
        netns_patterns=(re.compile("cni-.*"),),
    )
    nobody = RuntimeView(endpoint="none", name=None, version=None, reachable=True, error=None, sandboxes=())
    policy = Policy(min_age=0, confirmations=1, stuck_after=1e9)

    def look(kinds: tuple[Kind[Any], ...]) -> tuple[NodeSnapshot, dict[str, list[str]], list[str]]:
        snap = take_snapshot(opts, registry=Registry(kinds=kinds))
        report, _ = reconcile(snap, nobody, {}, policy, time.time(), correlate(snap, nobody, Registry(kinds=kinds)))
        verdicts = {",".join(sorted(r.name for r in a.resources)): [a.verdict, a.reason] for a in report.attachments}
        return snap, verdicts, [e.error for e in snap.errors]

    _, before, _ = look((netns.KIND, veth.KIND))  # what the reaper saw without the mount walk
    snap, after, errors = look((netns.KIND, heldns.KIND, veth.KIND))
    held_records = [r for r in snap.of("heldns") if list(r.ns) in (a_key, key(b))]
    veths = {v.name: v for v in snap.of("veth")}
    ctx = ReclaimContext(
        netns_dirs=(pins,), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=30.0, done={}
    )
    reclaim_ha = veth.reclaim([veths["ha"]], ctx)[veth.identity(veths["ha"])]
    ha_left = link_left("ha")
    busy_at_scan = busy(pins)
    # The held pod's lease, split from its namespace now that the pin is gone: its address is
    # configured in the held namespace, so it stays.
    lease = HostLocalLease(
        network="net1",
        ip="10.9.0.2",
        container_id="c" * 64,
        ifname="eth0",
        path=os.path.join(work, "10.9.0.2"),
        data_dir=work,
        mtime=0.0,
    )
    split = Attachment(
        key=AttachmentKey("c" * 64, "net1", "eth0"),
        resources=(hostlocal.KIND.ref(lease),),
        netns=None,
        verdict="orphan",
        reason="",
        age_seconds=1e6,
    )
    address_left = addresses_in_use([split], {hostlocal.KIND.identity(lease): lease}, (pins,)).get(split.key)

    # After the scan, another process mounts b's namespace in a mount namespace of its own: the
    # re-check and the veth reclaim see it.
    late = hold(b, os.path.join(work, "held-late"))
    busy_late = busy(pins)
    reclaim_hb = veth.reclaim([veths["hb"]], ctx)[veth.identity(veths["hb"])]
    hb_left = link_left("hb")
    late.kill()
    late.wait()
    busy_after_late = busy(pins)

    # A mount namespace no process is in, pinned on a file, holds c's namespace: it is entered to
    # be read, and its mount is a holder with no pid.
    c = pin(pins, "cni-cccccccc-0000-0000-0000-000000000000")
    c_key = key(c)
    mnt_pin = os.path.join(work, "mnt-pin")
    open(mnt_pin, "w").close()
    # A mount namespace of its own bound on a file here, then its process gone: no process is in it.
    # The kernel refuses the bind (EINVAL) unless the namespace's id is above this one's, and ids
    # are handed out per CPU, so a namespace made later may have a lower one: made again until not.
    for _ in range(2000):
        empty = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"], text=True)
        HOLDERS.append(empty)
        while os.stat(f"/proc/{empty.pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            time.sleep(0.001)  # until unshare has made its namespace
        bound = subprocess.run(
            ["mount", "--bind", f"/proc/{empty.pid}/ns/mnt", mnt_pin], capture_output=True, check=False
        )
        if bound.returncode == 0:
            break
        empty.kill()
        empty.wait()
    assert bound.returncode == 0, bound.stderr
    # In it, c's namespace is bound on a file; then the last process in it goes.
    open(os.path.join(work, "held-c"), "w").close()
    sh("nsenter", f"--mount={mnt_pin}", *probe_argv(bind_holder, c, os.path.join(work, "held-c"), "once"))
    empty.kill()
    empty.wait()
    sh("umount", c)
    os.unlink(c)
    busy_pinned = busy(pins)
    mnt_pin_ino = os.stat(mnt_pin).st_ino

    # One thread of a process with a mount namespace of its own (its process's is the probe's)
    # holds d's namespace: the walk reads every thread's.
    d = pin(pins, "cni-dddddddd-0000-0000-0000-000000000000")
    d_key = key(d)
    open(os.path.join(work, "held-d"), "w").close()
    threaded = subprocess.Popen(
        probe_argv(bind_holder, d, os.path.join(work, "held-d"), "thread"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    HOLDERS.append(threaded)
    assert threaded.stdout is not None
    holding_thread = int(threaded.stdout.readline())
    sh("umount", d)
    os.unlink(d)
    busy_thread = busy(pins)

    with open(f"/proc/{holder.pid}/mountinfo") as f:
        holders_mount = any(line.split(" ")[4] == held for line in f)
    reach = os.stat(f"/proc/{holder.pid}/root{held}")
    holder_mnt = os.stat(f"/proc/{holder.pid}/ns/mnt").st_ino
    holder.kill()
    holder.wait()
    out = {
        "alive": alive,
        "before": before,
        "after": after,
        "errors": errors,
        "held": [[list(r.ns), [[m.pid, m.mount_ns, m.mount_point] for m in r.mounts]] for r in held_records],
        "a": a_key,
        "b": key(b),
        "reach": [reach.st_dev, reach.st_ino],
        "holder": holder.pid,
        "holder_mnt": holder_mnt,
        "late": late.pid,
        "held_path": held,
        "ha_peer": list(veths["ha"].peer_netns or []),
        "reclaim_ha": [reclaim_ha.ok, reclaim_ha.error],
        "ha_left": ha_left,
        "reclaim_hb": [reclaim_hb.ok, reclaim_hb.error],
        "hb_left": hb_left,
        "busy_at_scan": busy_at_scan,
        "busy_late": busy_late,
        "busy_after_late": busy_after_late,
        "holders_mount": holders_mount,
        "address_left": address_left,
        "c": c_key,
        "busy_pinned": busy_pinned,
        "mnt_pin": mnt_pin_ino,
        "d": d_key,
        "busy_thread": busy_thread,
        "threaded": threaded.pid,
        "holding_thread": holding_thread,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
