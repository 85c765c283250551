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

import pytest

from tests.harness.probe import probe_argv
from tests.harness.probes import unprivileged_holds


def run(case: str) -> dict[str, object]:
    argv = ["unshare", "--mount", "--propagation", "private", "--net", "--pid", "--fork", "--mount-proc"]
    proc = subprocess.run([*argv, *probe_argv(unprivileged_holds, case)], capture_output=True, text=True, timeout=120)
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
