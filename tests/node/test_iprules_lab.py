"""AWS VPC CNI's per-pod policy rules on a real lab: rules shaped as the plugin adds them for
a leak's address, a live pod's and an address no one holds, and an admin's rules of other
shapes (one on the leak's address); `reaper reap` deletes the leak's two rules only, and the
unheld address's are reported unconfirmed. Every rule is added in the lab's netns, never the
host's."""

from __future__ import annotations

from pathlib import Path

from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.reap_helpers import REAP, SCAN, cached_result, leak_left, pings
from tests.harness.reaper_cli import attachments_by_key, names, run_reaper

ENI_TABLE = "2"
STRAY = "192.0.2.77"  # TEST-NET-1: no lease or cached result of the lab holds it


def plugin_rules(ip: str) -> list[list[str]]:
    """The two rules AWS VPC CNI adds for a pod on a secondary ENI (`ip rule add` arguments)."""
    return [
        ["to", f"{ip}/32", "lookup", "main", "pref", "512"],
        ["from", f"{ip}/32", "lookup", ENI_TABLE, "pref", "1536"],
    ]


def rule_names(ip: str) -> set[str]:
    return {f"512: to {ip}/32 lookup main", f"1536: from {ip}/32 lookup {ENI_TABLE}"}


def rules(lab: Lab) -> set[str]:
    """The lab netns' IPv4 policy rules, as `ip rule` prints them."""
    return set(lab.run_in_netns(["ip", "-4", "rule", "show"], check=True).stdout.splitlines())


def test_the_leaks_rules_go_and_the_live_pods_and_the_admins_stay(tmp_path: Path) -> None:
    with Lab() as lab:
        net = lab.network_name
        web = lab.run_pod("web")
        web_ip = labcni.result_ip(cached_result(lab, web))
        leak = lab.make_leak(with_cache=True)
        admin = [
            ["from", f"{leak.ip}/32", "lookup", "100", "pref", "1000"],  # the leak's address, another priority
            ["from", f"{leak.ip}/32", "iif", "eth9", "lookup", "7", "pref", "700"],
            ["to", "10.0.0.0/8", "lookup", "main", "pref", "512"],  # the plugin's priority, a subnet
        ]
        for args in [*plugin_rules(web_ip), *plugin_rules(leak.ip), *plugin_rules(STRAY), *admin]:
            lab.run_in_netns(["ip", "rule", "add", *args], check=True)
        before = rules(lab)
        leaks = {line for line in before if f" {leak.ip} lookup main" in line or f"from {leak.ip} lookup 2" in line}
        assert len(leaks) == 2, sorted(before)

        scan = run_reaper(lab, "scan", tmp_path / "scan.json", "--json", *SCAN)
        assert scan.returncode == 1, scan.stdout[-3000:] + scan.stderr  # orphans found
        by_key = attachments_by_key(scan.doc)
        orphan = by_key[(leak.container_id, net, labcni.IFNAME)]
        live = by_key[(web, net, labcni.IFNAME)]
        assert orphan["verdict"] == "orphan" and names(orphan, "iprule") == rule_names(leak.ip)
        assert live["verdict"] == "live" and names(live, "iprule") == rule_names(web_ip)
        unconfirmed = {u["name"] for u in scan.doc["unconfirmed"] if u["kind"] == "iprule"}
        assert unconfirmed == rule_names(STRAY)

        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == leak.container_id]
        freed = {r["name"]: (r["method"], r["ok"]) for r in outcome["resources"] if r["kind"] == "iprule"}
        assert freed == {name: ("kernel", True) for name in rule_names(leak.ip)}, outcome
        assert leak_left(lab, leak) == []
        assert rules(lab) == before - leaks
        assert {u["name"] for u in run.doc["unconfirmed"] if u["kind"] == "iprule"} == rule_names(STRAY)
        assert pings(lab, web)
