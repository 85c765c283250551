"""The firewall plugin's CNI-FORWARD rules on a real lab: Debian's `firewall` plugin accepts a
leak's and a live pod's addresses, and addresses no lease holds; `reaper reap` deletes the
leak's two rules, keeps the pod's (it still answers), the unleased ones (reported unconfirmed)
and the plugin's shared chains and jumps."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path

from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.reap_helpers import (
    REAP,
    SCAN,
    cached_result,
    filter_lines,
    firewall_rules_of,
    leak_left,
    pings,
    rule_specs,
)
from tests.harness.reaper_cli import attachments_by_key, names, run_reaper

SHARED = (
    ":CNI-ADMIN - [0:0]",
    ":CNI-FORWARD - [0:0]",
    '-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD',
    '-A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN',
)
STRAY_V4 = "192.0.2.77"  # TEST-NET-1: no lease of the lab holds it
STRAY_V6 = "fd00:77::5"


def accept(lab: Lab, container_id: str, netns: str, prev_result: Mapping[str, object]) -> None:
    """The firewall plugin's ADD for an attachment of the lab's network, chained after the
    bridge's result as a conflist would run it, in the lab's netns."""
    call = labcni.PluginCall("ADD", container_id, netns, labcni.IFNAME, (), lab.bin_dir, lab.netns_path)
    conf = {
        "cniVersion": labcni.CNI_VERSION,
        "name": lab.network_name,
        "type": "firewall",
        "backend": "iptables",
        "prevResult": dict(prev_result),
    }
    labcni.exec_plugin(call, conf)


def test_the_leaks_rules_go_and_the_live_pods_and_unleased_ones_stay(tmp_path: Path) -> None:
    with Lab() as lab:
        net = lab.network_name
        web = lab.run_pod("web")
        web_netns = lab.pod_netns_path(web)
        assert web_netns is not None
        web_result = cached_result(lab, web)
        web_ip = labcni.result_ip(web_result)
        leak = lab.make_leak(with_cache=True)

        accept(lab, web, str(web_netns), web_result)
        accept(lab, leak.container_id, str(leak.netns_path), leak.result)
        stray = {
            "cniVersion": labcni.CNI_VERSION,
            "interfaces": [{"name": labcni.IFNAME}],
            "ips": [{"address": f"{STRAY_V4}/24", "interface": 0}, {"address": f"{STRAY_V6}/64", "interface": 0}],
        }
        accept(lab, secrets.token_hex(32), str(lab.netns_path), stray)
        strays = firewall_rules_of(STRAY_V4) | firewall_rules_of(STRAY_V6, 128)
        before = filter_lines(lab)
        # The real plugin's rules read exactly as the reaper expects them.
        assert firewall_rules_of(web_ip) | firewall_rules_of(leak.ip) | strays | set(SHARED) <= before, sorted(before)
        assert pings(lab, web)

        scan = run_reaper(lab, "scan", tmp_path / "scan.json", "--json", *SCAN)
        assert scan.returncode == 1, scan.stdout[-3000:] + scan.stderr  # orphans found
        by_key = attachments_by_key(scan.doc)
        orphan = by_key[(leak.container_id, net, labcni.IFNAME)]
        live = by_key[(web, net, labcni.IFNAME)]
        assert orphan["verdict"] == "orphan" and names(orphan, "firewall") == rule_specs(firewall_rules_of(leak.ip))
        assert live["verdict"] == "live" and names(live, "firewall") == rule_specs(firewall_rules_of(web_ip))
        unconfirmed = {u["name"]: u for u in scan.doc["unconfirmed"] if u["kind"] == "firewall"}
        assert set(unconfirmed) == rule_specs(strays)
        assert all("no host-local lease holds" in u["owner"] for u in unconfirmed.values())

        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == leak.container_id]
        # The cached config (bridge, portmap) has no firewall: its DEL leaves the rules, the
        # kernel step deletes them.
        freed = {r["name"]: (r["method"], r["ok"]) for r in outcome["resources"] if r["kind"] == "firewall"}
        assert freed == {spec: ("kernel", True) for spec in rule_specs(firewall_rules_of(leak.ip))}, outcome
        assert leak_left(lab, leak) == []

        after = filter_lines(lab)
        assert not firewall_rules_of(leak.ip) & after, "the leak's rules are left"
        assert firewall_rules_of(web_ip) | strays | set(SHARED) <= after, "a rule not the leak's was deleted"
        assert after == before - firewall_rules_of(leak.ip)
        assert {u["name"] for u in run.doc["unconfirmed"] if u["kind"] == "firewall"} == rule_specs(strays)
        assert pings(lab, web)

        again = run_reaper(lab, "scan", tmp_path / "after.json", "--json", *SCAN)
        assert again.returncode == 0 and again.doc["summary"]["orphan"] == 0
        web_after = attachments_by_key(again.doc)[(web, net, labcni.IFNAME)]
        assert names(web_after, "firewall") == rule_specs(firewall_rules_of(web_ip))
