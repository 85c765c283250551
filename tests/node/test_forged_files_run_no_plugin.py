"""Files under /var/lib/cni never vouch for one another, and a prevResult is read by meaning: what
a writer of the CNI dirs (a pod with a hostPath on /var/lib/cni) forges never makes a root plugin
run, tried with the real plugins (bridge, host-local, firewall, portmap) on a real containerd.

An attachment made only of files (a lease and a cache entry, a lease and a flannel file) gets no
plugin: before, the lease counted as the "independent" corroboration, so the cache entry's
config or the conf dir's config ran DEL as root. A cached prevResult that names a live pod's
address in another spelling (an IPv4-mapped IPv6 address, the keys `IPs`/`Address`, which Go's
JSON decoding takes as `ips`/`address`) never reaches the firewall plugin, whose DEL deletes the
rules of the addresses it is given. The real leaks still go: a partial ADD that left only a
lease and a masquerade chain (containerd 2.2, CRI-O 1.35) by the kernel step, a containerd 1.6
leak with no cache entry by the conf dir's config.

Every test checks that the live pod keeps every resource (its firewall rules included) and still
answers ping, and that the files outside the CNI dirs (the conf and bin dirs, and host files a
forged config names) are byte-identical.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.configs import cache_doc
from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.reap_helpers import (
    REAP,
    SCAN,
    cached_result,
    filter_lines,
    firewall_rules_of,
    leak_left,
    nat_chains,
    pings,
)
from tests.harness.reaper_cli import ReaperRun, attachments_by_key, run_reaper

CANARY = "reaper-canary"
FLANNEL_NET = "cbr0"  # the network of flannel's config in the conf dir
# A plugin that records every run, then succeeds. Named `flannel` too: Debian ships no flannel,
# and all that matters here is whether the node's flannel config runs at all.
RECORDER = """#!/bin/sh
if [ "$CNI_COMMAND" = "VERSION" ]; then
    printf '%s\\n' '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'
    exit 0
fi
cat > "{marker}.$CNI_COMMAND.$CNI_CONTAINERID"
exit 0
"""

Key = tuple[str | None, str | None, str | None]


@dataclass
class Node:
    lab: Lab
    web: str
    web_ip: str
    markers: Path
    host: Path  # files outside every CNI dir that forged configs name


@pytest.fixture(scope="module")
def node(lab: Lab, web: str, tmp_path_factory: pytest.TempPathFactory) -> Node:
    """A lab with one live pod whose address the firewall plugin accepts (as a conflist with
    firewall would have made it), recorder plugins and a dir of host files."""
    markers = tmp_path_factory.mktemp("markers")
    host = tmp_path_factory.mktemp("host")
    for name in (CANARY, "flannel"):
        lab.install_plugin(name, RECORDER.replace("{marker}", str(markers / name)))
    result = cached_result(lab, web)
    netns = lab.pod_netns_path(web)
    assert netns is not None
    call = labcni.PluginCall("ADD", web, str(netns), "eth0", (), lab.bin_dir, lab.netns_path)
    firewall = {"type": "firewall", "backend": "iptables", "name": lab.network_name, "cniVersion": "1.0.0"}
    labcni.exec_plugin(call, {**firewall, "prevResult": result})
    web_ip = labcni.result_ip(result)
    assert firewall_rules_of(web_ip) <= filter_lines(lab)
    return Node(lab, web, web_ip, markers, host)


def _ran(node: Node) -> list[str]:
    return sorted(p.name for p in node.markers.iterdir())


def _live(node: Node, tmp: Path) -> dict[Key, list[tuple[str, str]]]:
    run = run_reaper(node.lab, "scan", tmp / f"live-{secrets.token_hex(4)}.json", "--json", *SCAN)
    live = {k: a for k, a in attachments_by_key(run.doc).items() if a["verdict"] == "live"}
    return {k: sorted((r["kind"], r["name"]) for r in a["resources"]) for k, a in live.items()}


def _outside(node: Node) -> dict[str, tuple[str, int, int]]:
    """Every file outside the CNI dirs the pass could be made to touch: content, mode, inode."""
    found = {}
    for top in (node.host, node.lab.conf_dir, node.lab.bin_dir):
        for path in sorted(top.rglob("*")):
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            found[str(path)] = (digest, st.st_mode, st.st_ino)
    return found


class Guard:
    """What must hold after every pass: the live pod and the files outside the CNI dirs."""

    def __init__(self, node: Node, tmp: Path) -> None:
        self.node, self.tmp = node, tmp
        self.live = _live(node, tmp)
        assert (self.node.web, node.lab.network_name, "eth0") in self.live
        self.outside = _outside(node)
        self.rules = firewall_rules_of(node.web_ip)
        assert self.rules <= filter_lines(node.lab), "the live pod's rules were gone before this pass"

    def check(self) -> None:
        assert self.rules <= filter_lines(self.node.lab), "the live pod's CNI-FORWARD rules were deleted"
        assert _live(self.node, self.tmp) == self.live, "a live attachment lost or gained a resource"
        assert _outside(self.node) == self.outside, "a file outside the CNI dirs changed"
        assert pings(self.node.lab, self.node.web)


def _free_ip(lab: Lab, n: int) -> str:
    return str(ipaddress.ip_network(lab.subnet)[-2 - n])


def _forge_lease(lab: Lab, network: str, ip: str, cid: str) -> Path:
    directory = lab.ipam_dir / network
    directory.mkdir(exist_ok=True)
    lease = directory / ip
    lease.write_bytes(f"{cid}\r\neth0".encode())
    return lease


def _forge_cache(lab: Lab, cid: str, plugins: list[dict[str, Any]], result: dict[str, Any]) -> Path:
    entry = lab.cache_dir / "results" / f"{lab.network_name}-{cid}-eth0"
    config = {"cniVersion": "1.0.0", "name": lab.network_name, "plugins": plugins}
    entry.write_text(json.dumps(cache_doc(cid, lab.network_name, config=config, result=result)))
    return entry


def _outcome(run: ReaperRun, cid: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [o for o in run.doc["reclaimed"] if o["container_id"] == cid]
    assert len(found) == 1, run.doc["reclaimed"]
    return found[0]


def _planned(run: ReaperRun, cid: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [p for p in run.doc["plan"] if p["container_id"] == cid]
    assert len(found) == 1, run.doc["plan"]
    return found[0]


def _node_plugins(lab: Lab) -> list[dict[str, Any]]:
    plugins: list[dict[str, Any]] = json.loads(lab.network_spec.conflist_bytes("normal"))["plugins"]
    return plugins


def test_an_orphan_of_a_forged_lease_and_cache_entry_runs_no_plugin(node: Node, tmp_path: Path) -> None:
    """A lease and a cache entry, both forged for an ID nothing on the node knows. The lease
    used to corroborate the entry: its config (the node's plugins and one the operator allowed)
    ran as root. Now no plugin runs: the lease goes as a file, and the entry, whose chain names
    a plugin not known to be stateless (the canary), stays, reported as needing that plugin's
    DEL (the pass exits 1). The test then removes it, as an operator would."""
    lab, guard = node.lab, Guard(node, tmp_path)
    forged = secrets.token_hex(32)
    ip = _free_ip(lab, 0)
    lease = _forge_lease(lab, lab.network_name, ip, forged)
    result = {"cniVersion": "1.0.0", "ips": [{"address": f"{ip}/24"}]}
    entry = _forge_cache(lab, forged, [*_node_plugins(lab), {"type": CANARY}], result)
    try:
        plan = run_reaper(lab, "reap", tmp_path / "plan.json", "--json", *REAP, "--allow-plugin", CANARY, "--dry-run")
        planned = _planned(plan, forged)
        assert planned["config"] is None and "no netns pin or host veth" in planned["config_note"], planned
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--allow-plugin", CANARY)
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr
        assert not [m for m in _ran(node) if forged in m], "a plugin ran for an attachment only files make"
        outcome = _outcome(run, forged)
        assert outcome["needs_plugin"] == CANARY and outcome["plugin_errors"] == [], outcome
        assert {(r["kind"], r["method"], r["ok"]) for r in outcome["resources"]} == {
            ("ipam", "kernel", True),
            ("cache", "kernel", False),
        }
        (kept,) = [r for r in outcome["resources"] if r["kind"] == "cache"]
        assert (
            kept["error"].startswith(f"kept: {CANARY} may keep state only its DEL frees")
            and "no DEL runs" in kept["error"]
        ), kept
        assert not lease.exists() and entry.exists()
        assert [o["container_id"] for o in run.doc["reclaimed"] if not all(r["ok"] for r in o["resources"])] == [
            forged
        ], "something else was left"
        guard.check()
    finally:
        # What the operator does once the plugin's own state is freed; the next tests of the
        # module start from a node with nothing left.
        entry.unlink(missing_ok=True)
        lease.unlink(missing_ok=True)


def test_an_orphan_of_a_forged_lease_and_flannel_file_runs_no_plugin(node: Node, tmp_path: Path) -> None:
    """The node runs flannel (its config in the conf dir, data dir /var/lib/cni/flannel). A
    forged lease in flannel's network and a forged flannel file whose delegate is `firewall`
    with the live pod's address, and host-local with a dataDir outside every CNI dir: flannel's
    DEL would run what the file names. The conf dir's flannel config used to run for this
    orphan; now no plugin does, and the lease and the file go as files."""
    lab = node.lab
    conf = lab.conf_dir / "99-flannel.conflist"
    conf.write_text(json.dumps({"cniVersion": "1.0.0", "name": FLANNEL_NET, "plugins": [{"type": "flannel"}]}))
    data_dir = lab.cache_dir / "flannel"
    data_dir.mkdir(mode=0o700, exist_ok=True)
    forged = secrets.token_hex(32)
    # What host-local's DEL with that dataDir would release: a file holding the ID, in a dir
    # named after the network.
    (node.host / FLANNEL_NET).mkdir()
    (node.host / FLANNEL_NET / "10.42.0.250").write_text(forged)
    lease = _forge_lease(lab, FLANNEL_NET, "10.42.0.250", forged)
    delegate = {
        "cniVersion": "1.0.0",
        "name": FLANNEL_NET,
        "type": "firewall",
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": f"{node.web_ip}/24"}]},
        "ipam": {"type": "host-local", "dataDir": str(node.host)},
    }
    scratch = data_dir / forged
    scratch.write_text(json.dumps(delegate))
    guard = Guard(node, tmp_path)
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        assert not [m for m in _ran(node) if forged in m], "the node's flannel config ran for forged files"
        outcome = _outcome(run, forged)
        assert {(r["kind"], r["method"], r["ok"]) for r in outcome["resources"]} == {
            ("ipam", "kernel", True),
            ("flannel", "kernel", True),
        }
        assert not lease.exists() and not scratch.exists()
        guard.check()
    finally:
        conf.unlink()
        lease.unlink(missing_ok=True)
        scratch.unlink(missing_ok=True)


def test_a_forged_lease_no_longer_corroborates_a_cache_entry_for_firewall(node: Node, tmp_path: Path) -> None:
    """The red team's case: a forged cache entry whose config is the real `firewall` plugin (the
    operator allows it) and whose prevResult names the live pod's address under the keys `IPs`
    and `Address`, beside a forged lease of the same ID. The lease counted as corroboration and
    the text check saw no `ips`: firewall's DEL deleted the live pod's CNI-FORWARD rules."""
    lab, guard = node.lab, Guard(node, tmp_path)
    forged = secrets.token_hex(32)
    lease = _forge_lease(lab, lab.network_name, _free_ip(lab, 1), forged)
    result = {"cniVersion": "1.0.0", "IPs": [{"Address": f"{node.web_ip}/24"}]}
    entry = _forge_cache(lab, forged, [{"type": "firewall", "backend": "iptables"}], result)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--allow-plugin", "firewall")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert {r["method"] for r in _outcome(run, forged)["resources"]} == {"kernel"}
    assert not lease.exists() and not entry.exists()
    guard.check()


def _mapped(ip: str) -> str:
    return f"::ffff:{ip}/120"


def _mapped_hex(ip: str) -> str:
    packed = ipaddress.IPv4Address(ip).packed
    return f"::FFFF:{packed[:2].hex()}:{packed[2:].hex()}/120"


@pytest.mark.parametrize(
    ("ips_key", "address_key", "spell"),
    [("IPs", "Address", _mapped), ("ips", "address", _mapped_hex)],
)
def test_a_prev_result_spelling_a_live_pods_address_otherwise_never_reaches_firewall(
    node: Node, tmp_path: Path, ips_key: str, address_key: str, spell: Any
) -> None:
    """A real leak (pin, veth, lease, chains, cache entry) whose cache entry runs `firewall` too,
    its prevResult rewritten to name the live pod's address as an IPv4-mapped IPv6 address
    (net.ParseCIDR reads it as the IPv4 one, so firewall deletes that address's rules). The
    entry's config does not run: the node's own config frees the leak, and the live pod's
    firewall rules stay."""
    lab, guard = node.lab, Guard(node, tmp_path)
    leak = lab.make_leak(with_cache=True)
    assert leak.cache_path is not None
    doc = json.loads(leak.cache_path.read_bytes())
    doc["result"].pop("ips")
    doc["result"][ips_key] = [{address_key: spell(node.web_ip), "interface": 2}]
    plugins = [*_node_plugins(lab), {"type": "firewall", "backend": "iptables"}]
    config = {"cniVersion": "1.0.0", "name": lab.network_name, "plugins": plugins}
    doc["config"] = base64.b64encode(json.dumps(config).encode()).decode()
    leak.cache_path.write_text(json.dumps(doc))
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--allow-plugin", "firewall")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert leak_left(lab, leak) == []
    methods = {r["kind"]: r["method"] for r in _outcome(run, leak.container_id)["resources"]}
    assert methods["ipam"] == "cni-del", "the node's own config ran DEL"
    guard.check()


def test_a_partial_add_that_left_a_lease_and_a_chain_is_reclaimed_by_the_kernel(node: Node, tmp_path: Path) -> None:
    """containerd 2.2 and CRI-O 1.35: a chained ADD whose last plugin fails is followed by a DEL
    with the netns gone, which leaves the host-local lease and bridge's masquerade chain (no
    pin, no veth, no cache entry). No plugin runs for them now; the kernel step frees both."""
    lab, guard = node.lab, Guard(node, tmp_path)
    leak = lab.make_leak(with_cache=False)
    subprocess.run(["umount", str(leak.netns_path)], check=True)
    leak.netns_path.unlink()
    assert leak.lease_path.exists() and leak.masq_chain in nat_chains(lab)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert leak_left(lab, leak) == []
    outcome = _outcome(run, leak.container_id)
    assert {r["kind"] for r in outcome["resources"]} >= {"ipam", "iptables"}
    assert {r["method"] for r in outcome["resources"]} == {"kernel"}
    assert not [m for m in _ran(node) if leak.container_id in m]
    guard.check()


def test_a_leak_with_a_pin_and_no_cache_entry_still_gets_the_conf_dirs_del(node: Node, tmp_path: Path) -> None:
    """containerd 1.6 writes no cache entry for a network whose chained ADD failed, but does for
    the sandbox's loopback, which names the pin: the pin and its veth join the lease and the
    chain, prove the attachment, and the conf dir's config runs DEL for it, as before. The
    loopback entry is proven by that pin too (its own config, which no conf dir config uses,
    does not run; it goes as a file)."""
    lab, guard = node.lab, Guard(node, tmp_path)
    leak = lab.make_leak(with_cache=False)
    live_lo = lab.cache_dir / "results" / f"cni-loopback-{node.web}-lo"
    text = live_lo.read_text().replace(node.web, leak.container_id)
    doc = json.loads(text.replace(str(lab.pod_netns_path(node.web)), str(leak.netns_path)))
    assert [i["sandbox"] for i in doc["result"]["interfaces"]] == [str(leak.netns_path)], doc
    lo = lab.cache_dir / "results" / f"cni-loopback-{leak.container_id}-lo"
    lo.write_text(json.dumps(doc))
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert leak_left(lab, leak) == [] and not lo.exists()
    (eth0,) = [o for o in run.doc["reclaimed"] if o["container_id"] == leak.container_id and o["ifname"] == "eth0"]
    methods = {r["kind"]: r["method"] for r in eth0["resources"]}
    assert methods["ipam"] == "cni-del" and methods["veth"] == "cni-del", methods
    (plan,) = [p for p in run.doc["plan"] if p["container_id"] == leak.container_id and p["ifname"] == "eth0"]
    assert plan["config"] == str(lab.conf_dir / f"10-{lab.network_name}.conflist"), plan
    guard.check()
