"""Another runtime on the node: podman (Debian's, CNI backend) shares the cache, lease and netns
dirs with the kubelet's runtime, and no CRI runtime lists its containers. Its running
containers keep every resource; a container that died without podman's cleanup is a leak
like any other, reclaimed once proven dead."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reaper.kinds.cache import collect_cache
from reaper.kinds.iptables import chain_name
from tests.harness.lab import Lab
from tests.harness.passes import settled_memo
from tests.harness.podman import NETWORK, LabPodman
from tests.harness.reap_helpers import REAP, pings
from tests.harness.reaper_cli import attachments_by_key, names, run_reaper


@pytest.fixture(scope="module")
def world(lab: Lab, web: str) -> Iterator[tuple[Lab, LabPodman, str]]:
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


def _iptables_lines(lab: Lab, ip: str, chain: str) -> set[str]:
    """The rules (every table) that name the container's address or its masquerade chain."""
    text = lab.run_in_netns(["iptables-save"], check=True).stdout
    return {line for line in text.splitlines() if f"{ip}/32" in line or chain in line}


def _hostile_memo(lab: Lab) -> bytes:
    """A `<state>.memo` as the reaper's on-disk memo (version 2) was written until it went, every
    cache row's netns path set to null and its stamps kept: a version that loads it takes the
    cache entries to be of no namespace. Values as the cache kind keeps them, read by its own
    parser; stamps as the look takes them (lstat)."""
    memo = settled_memo()
    memo.start_pass()
    collect_cache(str(lab.cache_dir), {NETWORK}, memo.of("cache"))
    memo.end_pass()
    rows = []
    for path, st, value in memo.of("cache").items():
        assert isinstance(value, tuple) and value[3], value  # its netns path, as the file says
        rows.append([path, list(st), [*value[:3], None, *value[4:]]])
    assert rows
    return json.dumps({"version": 2, "kinds": {"cache": rows}, "outputs": []}).encode()


def test_a_one_shot_reap_reads_no_memo_a_writer_of_the_state_dir_edited(
    world: tuple[Lab, LabPodman, str], tmp_path: Path
) -> None:
    """Issue 23, case 3: a memo whose cache rows say "no netns" made a running container's cache
    entry, lease, chain and firewall rules an attachment of no namespace, an orphan, reclaimed
    with the container inside. A one-shot now reads every file afresh and never the memo."""
    lab, podman, web = world
    cid = podman.run("box-memo")
    ip = podman.ip(cid)
    chain = chain_name("", NETWORK, cid)
    rules = _iptables_lines(lab, ip, chain)
    assert any(f"-A {chain} " in r for r in rules) and sum("CNI-FORWARD" in r for r in rules) >= 2, rules
    files = {p: p.read_bytes() for p in podman_files(lab, cid)}  # its cache entry, every podman lease
    assert lab.ipam_dir / NETWORK / ip in files and any(p.name.startswith(f"{NETWORK}-{cid}-") for p in files)
    assert answers(lab, ip)
    state = tmp_path / "state.json"
    memo = tmp_path / "state.json.memo"
    memo.write_bytes(_hostile_memo(lab))
    memo.chmod(0o600)
    planted = memo.read_bytes()

    flags = ("--json", "--netns-dir", "/run/netns", *REAP)
    run = run_reaper(lab, "reap", state, *flags, wrap=podman.node_view())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    got = attachments_by_key(run.doc)
    attachment = got[(cid, NETWORK, "eth0")]
    assert attachment["verdict"] == "live" and "inside its netns" in attachment["reason"], attachment
    assert sorted(r["kind"] for r in attachment["resources"]) == [
        "cache", "firewall", "firewall", "ipam", "iptables", "netns", "veth",
    ]  # fmt: skip
    assert not [o for o in run.doc["reclaimed"] if o["container_id"] == cid], run.doc["reclaimed"]
    assert {p: p.read_bytes() for p in podman_files(lab, cid)} == files
    assert _iptables_lines(lab, ip, chain) == rules
    assert answers(lab, ip), "the container no longer answers"
    assert memo.read_bytes() == planted, "the stale memo is left as it was: never read, never written"
    assert pings(lab, web)


def _split_from_its_netns(lab: Lab, cid: str, netns: str | None) -> None:
    """The container's cache entry as a writer of /var/lib/cni edits it: its `netns` and every
    interface's `sandbox` taken out (`netns` None), or pointed at another namespace's pin."""
    (entry,) = lab.cache_dir.glob(f"results/{NETWORK}-{cid}-*")
    doc = json.loads(entry.read_text())
    doc.pop("netns", None)
    for iface in doc.get("result", {}).get("interfaces", []):
        iface.pop("sandbox", None)
        if netns is not None and iface.get("name") == "eth0":
            iface["sandbox"] = netns
    if netns is not None:
        doc["netns"] = netns
    entry.write_text(json.dumps(doc))


def _held_in_its_netns(ip: str) -> str:
    """The start of the reason a reap gives for leaving an attachment whose address `ip` is
    configured in a podman container's namespace, the container's process inside."""
    return rf"its address {re.escape(ip)} is configured in the netns pinned at \S+/netns-\S+ \(pid \d+ inside\)"


def _reap_leaves_it(lab: Lab, podman: LabPodman, cid: str, state: Path, *extra: str) -> tuple[str, dict[str, Any]]:
    """A one-shot `reaper reap`, as the systemd unit runs it: the running container keeps its
    lease, cache entry, masquerade chain and firewall rules, and answers. Its skip's reason, and
    its attachment as the reap judged it."""
    ip = podman.ip(cid)
    chain = chain_name("", NETWORK, cid)
    rules = _iptables_lines(lab, ip, chain)
    assert any(f"-A {chain} " in r for r in rules) and sum("CNI-FORWARD" in r for r in rules) >= 2, rules
    files = {p: p.read_bytes() for p in podman_files(lab, cid)}  # its cache entry, every podman lease
    assert lab.ipam_dir / NETWORK / ip in files and any(p.name.startswith(f"{NETWORK}-{cid}-") for p in files)
    assert answers(lab, ip)

    flags = ("--json", "--netns-dir", "/run/netns", *REAP, *extra)
    run = run_reaper(lab, "reap", state, *flags, wrap=podman.node_view())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    attachment = attachments_by_key(run.doc)[(cid, NETWORK, "eth0")]
    assert attachment["verdict"] == "orphan", "split from its process, judged by its files"
    assert not [o for o in run.doc["reclaimed"] if o["container_id"] == cid], run.doc["reclaimed"]
    assert {p: p.read_bytes() for p in podman_files(lab, cid)} == files, "its lease or cache entry changed"
    assert _iptables_lines(lab, ip, chain) == rules, "its masquerade chain or firewall rules changed"
    assert answers(lab, ip), "the container no longer answers"
    (skip,) = [s for s in run.doc["skipped"] if s["container_id"] == cid]
    return str(skip["reason"]), attachment


def test_a_cache_entry_edited_to_name_no_netns_leaves_a_running_containers_files_live(
    world: tuple[Lab, LabPodman, str], tmp_path: Path
) -> None:
    """Issue 23: a writer of /var/lib/cni edits a running container's cache entry itself (no
    memo): its netns and every interface's sandbox taken out. Its lease, chain, rules and cache
    entry then make an attachment of no namespace, apart from its pin, veth and process: an
    orphan, since no CRI runtime lists podman's containers. Its address is configured in its
    namespace, with its process inside: the reap leaves the attachment whole, and says where."""
    lab, podman, web = world
    cid = podman.run("box-edited")
    _split_from_its_netns(lab, cid, None)
    reason, attachment = _reap_leaves_it(lab, podman, cid, tmp_path / "state.json")
    assert "netns" not in {r["kind"] for r in attachment["resources"]}, attachment
    assert re.match(_held_in_its_netns(podman.ip(cid)) + ", not its own: a live pod holds it$", reason), reason
    assert pings(lab, web)


def test_a_cache_entry_pointed_at_a_dead_pin_runs_no_del_for_a_running_container(
    world: tuple[Lab, LabPodman, str], tmp_path: Path
) -> None:
    """The writer points a running container's cache entry at another, dead pin (nothing inside,
    named as containerd names them): the pin joins the attachment, and with podman's network in
    the conf dir (so the cached config is the node's and runs) DEL would run with the live
    container's ID and that pin as CNI_NETNS, releasing its lease and deleting its masquerade
    chain and firewall rules; without a DEL the kernel step would. The address check leaves the
    attachment before any DEL or kernel step: all of it stays, the dead pin too."""
    lab, podman, web = world
    cid = podman.run("box-pointed")
    dead = lab.make_pin()
    _split_from_its_netns(lab, cid, f"/run/netns/{dead.name}")
    conf = ("--cni-conf-dir", str(podman.root / "net.d"))
    reason, attachment = _reap_leaves_it(lab, podman, cid, tmp_path / "state.json", *conf)
    assert names(attachment, "netns") == {dead.name}, "the dead pin joined the live container's files"
    assert re.match(_held_in_its_netns(podman.ip(cid)), reason), reason
    assert dead.exists(), "the dead pin went with the live container's attachment"
    assert pings(lab, web)
