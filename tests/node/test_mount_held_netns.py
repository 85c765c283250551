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
from tests.harness.probes import held_netns


def test_a_namespace_held_by_a_mount_in_another_mount_namespace_keeps_its_veth() -> None:
    out = run_probe(held_netns)
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
