"""Another runtime on the node: podman (Debian's, CNI backend) shares the cache, lease and netns
dirs with the kubelet's runtime, and no CRI runtime lists its containers. Its running
containers keep every resource; a container that died without podman's cleanup is a leak
like any other, reclaimed once proven dead."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.lab import Lab
from tests.harness.podman import NETWORK, LabPodman
from tests.harness.reap_helpers import REAP, pings
from tests.harness.reaper_cli import attachments_by_key, run_reaper


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Lab, LabPodman, str]]:
    with Lab() as lab:
        web = lab.run_pod("web")
        podman = LabPodman(lab)
        try:
            yield lab, podman, web
        finally:
            podman.close()


def answers(lab: Lab, ip: str) -> bool:
    return lab.run_in_netns(["ping", "-c", "1", "-W", "2", ip]).returncode == 0


def podman_files(lab: Lab, cid: str) -> list[Path]:
    return [*lab.cache_dir.glob(f"results/{NETWORK}-{cid}-*"), *(lab.ipam_dir / NETWORK).glob("10.*")]


def test_running_podman_containers_keep_everything_and_a_dead_ones_leftovers_go(
    world: tuple[Lab, LabPodman, str], tmp_path: Path
) -> None:
    lab, podman, web = world
    running = {name: podman.run(name) for name in ("box-a", "box-b")}
    ips = {name: podman.ip(cid) for name, cid in running.items()}
    pins_before = {p.name for p in lab.netns_dir.iterdir()}
    dead = podman.run("box-dead")
    dead_pin = {p.name for p in lab.netns_dir.iterdir()} - pins_before
    assert len(dead_pin) == 1 and next(iter(dead_pin)).startswith("netns-")
    podman.kill_hard("box-dead")
    assert all(answers(lab, ip) for ip in ips.values())
    before = {p.name for p in lab.netns_dir.iterdir()}

    # The reaper sees the node as podman does (/run/netns holds its pins), as it would on a node.
    flags = ("--json", "--netns-dir", "/run/netns", *REAP)
    run = run_reaper(lab, "reap", tmp_path / "state.json", *flags, wrap=podman.node_view())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    got = attachments_by_key(run.doc)
    for name, cid in running.items():
        attachment = got[(cid, NETWORK, "eth0")]
        assert attachment["verdict"] == "live" and attachment["owner"] == "other", attachment
        assert "inside its netns" in attachment["reason"]
        # podman's network runs the firewall plugin too: its two CNI-FORWARD rules are the pod's.
        kinds = sorted(r["kind"] for r in attachment["resources"])
        assert kinds == ["cache", "firewall", "firewall", "ipam", "iptables", "netns", "veth"], kinds
        assert answers(lab, ips[name]), f"podman container {name} no longer answers"
    leftover = got[(dead, NETWORK, "eth0")]
    assert leftover["verdict"] == "orphan" and leftover["owner"] == "other"
    (reclaimed,) = [o for o in run.doc["reclaimed"] if o["container_id"] == dead]
    assert all(r["ok"] for r in reclaimed["resources"]), reclaimed
    after = {p.name for p in lab.netns_dir.iterdir()}
    assert before - after == dead_pin, "the dead container's pin went, and nothing else"
    assert not list(lab.cache_dir.glob(f"results/{NETWORK}-{dead}-*"))
    assert all(list(lab.cache_dir.glob(f"results/{NETWORK}-{cid}-*")) for cid in running.values())
    assert pings(lab, web)
