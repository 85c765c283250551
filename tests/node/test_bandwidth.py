"""The bandwidth plugin's IFBs on a real lab: the real `bandwidth` plugin (Debian's) shapes a
leak and a live pod, then `reaper reap` frees the leak's IFB, keeps the pod's with its qdiscs
(the pod still answers through it), and never touches an IFB no attachment's key names. And
the dump they are found with: the kernel's filter by link kind, with and without it applying."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Mapping
from pathlib import Path

from reaper.kinds.bandwidth import ifb_name
from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.probe import probe_argv
from tests.harness.probes import links_by_kind
from tests.harness.reap_helpers import REAP, SCAN, cached_result, host_links, ifbs, leak_left, pings, qdiscs
from tests.harness.reaper_cli import attachments_by_key, names, run_reaper

# bits/s and bits: shaping, yet loose enough for a ping.
RATES = {"ingressRate": 8_000_000, "ingressBurst": 800_000, "egressRate": 8_000_000, "egressBurst": 800_000}


def shape(lab: Lab, container_id: str, netns: Path, prev_result: Mapping[str, object]) -> str:
    """Run the bandwidth plugin's ADD for an attachment of the lab's network, chained after the
    bridge's result as a conflist would run it; the name of the IFB the plugin reports."""
    call = labcni.PluginCall("ADD", container_id, str(netns), labcni.IFNAME, (), lab.bin_dir, lab.netns_path)
    conf = {
        "cniVersion": labcni.CNI_VERSION,
        "name": lab.network_name,
        "type": "bandwidth",
        **RATES,
        "prevResult": dict(prev_result),
    }
    result = labcni.exec_plugin(call, conf)
    interfaces = result["interfaces"]
    assert isinstance(interfaces, list)
    return str(interfaces[-1]["name"])  # the plugin appends its IFB, with no sandbox


def test_the_leaks_ifb_is_freed_and_the_live_pods_stays(tmp_path: Path) -> None:
    with Lab() as lab:
        net = lab.network_name
        web = lab.run_pod("web")
        web_netns = lab.pod_netns_path(web)
        assert web_netns is not None
        web_veth = lab.host_veth_of(web_netns)
        assert web_veth is not None
        leak = lab.make_leak(with_cache=True)

        web_ifb = shape(lab, web, web_netns, cached_result(lab, web))
        leak_ifb = shape(lab, leak.container_id, leak.netns_path, leak.result)
        # The real plugin names them exactly as the reaper computes.
        assert web_ifb == ifb_name(net, web) and leak_ifb == ifb_name(net, leak.container_id)
        nobody = "bwp" + secrets.token_hex(6)  # a plugin's name, but no attachment's
        lab.run_in_netns(["ip", "link", "add", nobody, "type", "ifb"], check=True)
        other = "bwp" + secrets.token_hex(6)  # the name, but not an ifb
        lab.run_in_netns(["ip", "link", "add", other, "type", "bridge"], check=True)
        assert {web_ifb, leak_ifb, nobody} <= ifbs(lab)
        for dev in (web_ifb, leak_ifb):
            assert "qdisc tbf 1: root" in qdiscs(lab, dev)
        web_veth_qdiscs = qdiscs(lab, web_veth)
        assert "qdisc tbf 1: root" in web_veth_qdiscs and "qdisc ingress ffff:" in web_veth_qdiscs
        assert pings(lab, web)

        scan = run_reaper(lab, "scan", tmp_path / "scan.json", "--json", *SCAN)
        assert scan.returncode == 1, scan.stdout[-3000:] + scan.stderr  # orphans found
        by_key = attachments_by_key(scan.doc)
        orphan = by_key[(leak.container_id, net, labcni.IFNAME)]
        live = by_key[(web, net, labcni.IFNAME)]
        assert orphan["verdict"] == "orphan" and names(orphan, "ifb") == {leak_ifb}
        assert live["verdict"] == "live" and names(live, "ifb") == {web_ifb}
        assert {u["name"] for u in scan.doc["unconfirmed"] if u["kind"] == "ifb"} == {nobody}
        assert other not in scan.stdout

        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == leak.container_id]
        # The cached config (bridge, portmap) has no bandwidth: its DEL leaves the IFB, the
        # kernel step frees it.
        (freed,) = [r for r in outcome["resources"] if r["kind"] == "ifb"]
        assert (freed["name"], freed["method"], freed["ok"]) == (leak_ifb, "kernel", True), outcome
        assert leak_left(lab, leak) == []
        assert leak_ifb not in host_links(lab)

        assert {web_ifb, nobody} <= ifbs(lab) and other in host_links(lab)
        assert {u["name"] for u in run.doc["unconfirmed"] if u["kind"] == "ifb"} == {nobody}
        assert "qdisc tbf 1: root" in qdiscs(lab, web_ifb)
        assert qdiscs(lab, web_veth) == web_veth_qdiscs
        assert pings(lab, web), "the live pod's egress goes through its IFB"

        after = run_reaper(lab, "scan", tmp_path / "after.json", "--json", *SCAN)
        assert after.returncode == 0 and after.doc["summary"]["orphan"] == 0
        assert names(attachments_by_key(after.doc)[(web, net, labcni.IFNAME)], "ifb") == {web_ifb}


def test_a_dump_by_kind_returns_that_kind_only_filtered_by_the_kernel_or_not() -> None:
    proc = subprocess.run(
        ["unshare", "--net", *probe_argv(links_by_kind)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ifbs = ["bwp0123456789ab", "ifbother"]
    assert out["ifb True"] == out["ifb False"] == out["public"] == ifbs
    # A kind the kernel has no link type for: it ignores the filter; nothing comes back either
    # way (read whole on a kernel not known to filter, cut at the first link otherwise).
    assert out["nosuchkind True"] == out["nosuchkind False"] == []
