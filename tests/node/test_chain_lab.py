"""bandwidth and firewall in the lab's own chain (bridge, portmap, bandwidth, firewall), as nodes
chain them, with pods made through containerd: a pod whose annotations ask for shaping gets
an IFB from the real bandwidth plugin (containerd passes the annotations as the `bandwidth`
capability) and CNI-FORWARD rules from the real firewall plugin. Both seed reports' leaks then
carry them too: a chain whose last plugin fails ADD (nothing cached, nobody calls DEL) and a
runtime that forgot a finished pod (cache entry with the capability in its runtimeConfig).
`reaper reap` frees the IFBs and rules of both; the live pod keeps its own and still answers."""

from __future__ import annotations

import json
from pathlib import Path

from reaper.kinds.bandwidth import ifb_name
from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.reap_helpers import (
    REAP,
    SCAN,
    cached_result,
    filter_lines,
    firewall_rules_of,
    ifbs,
    pings,
    qdiscs,
    rule_specs,
)
from tests.harness.reaper_cli import attachments_by_key, names, run_reaper

# What a pod spec's annotations say; containerd turns them into the capability arg.
SHAPED = {"kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "10M"}


def lease_ip(lab: Lab, container_id: str) -> str:
    """The address host-local gave the container (its lease file holds the ID)."""
    net_dir = lab.ipam_dir / lab.network_name
    (ip,) = [p.name for p in net_dir.iterdir() if p.name[0].isdigit() and p.read_text().startswith(container_id)]
    return ip


def test_bandwidth_and_firewall_in_the_chain_are_reclaimed_with_the_leaks(tmp_path: Path) -> None:
    with Lab(chain_extras=("bandwidth", "firewall")) as lab:
        net = lab.network_name
        lab.set_network("failing")
        chained = lab.try_run_pod("chained", annotations=SHAPED)
        lab.set_network("normal")
        assert chained.sandbox_id is not None and not chained.ok
        forgotten = lab.run_pod("forgotten", annotations=SHAPED)
        entry = json.loads((lab.cache_dir / "results" / f"{net}-{forgotten}-eth0").read_bytes())
        # What containerd handed libcni for the capability, as the cache keeps it for DEL: go-cni's
        # BandWidth has no JSON tags, so the keys are capitalised (the plugin reads them anyway).
        assert set(entry["capabilityArgs"]["bandwidth"]) >= {"IngressRate", "EgressRate"}, entry
        lab.forget_runtime_state()  # both sandboxes are now nobody's
        web = lab.run_pod("web", annotations=SHAPED)
        leaks = {chained.sandbox_id: lease_ip(lab, chained.sandbox_id), forgotten: lease_ip(lab, forgotten)}
        web_ip = labcni.result_ip(cached_result(lab, web))

        before_ifbs = ifbs(lab)
        before_rules = filter_lines(lab)
        for cid, ip in {**leaks, web: web_ip}.items():
            assert ifb_name(net, cid) in before_ifbs, (cid, before_ifbs)
            assert firewall_rules_of(ip) <= before_rules, (cid, sorted(before_rules))
        web_ifb = ifb_name(net, web)
        web_ifb_qdiscs = qdiscs(lab, web_ifb)
        assert "tbf" in web_ifb_qdiscs
        assert pings(lab, web)

        scan = run_reaper(lab, "scan", tmp_path / "scan.json", "--json", *SCAN)
        assert scan.returncode == 1, scan.stdout[-3000:] + scan.stderr
        by_key = attachments_by_key(scan.doc)
        for cid, ip in leaks.items():
            leak = by_key[(cid, net, labcni.IFNAME)]
            assert leak["verdict"] == "orphan", leak
            assert names(leak, "ifb") == {ifb_name(net, cid)}, leak
            assert names(leak, "firewall") == rule_specs(firewall_rules_of(ip)), leak
        live = by_key[(web, net, labcni.IFNAME)]
        assert live["verdict"] == "live"
        assert names(live, "ifb") == {web_ifb} and names(live, "firewall") == rule_specs(firewall_rules_of(web_ip))

        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        outcomes = {o["container_id"]: o for o in run.doc["reclaimed"]}
        assert set(leaks) <= set(outcomes), sorted(outcomes)
        for cid in leaks:
            freed = {(r["kind"], r["ok"]) for r in outcomes[cid]["resources"] if r["kind"] in ("ifb", "firewall")}
            assert freed == {("ifb", True), ("firewall", True)}, outcomes[cid]

        after_ifbs = ifbs(lab)
        after_rules = filter_lines(lab)
        for cid, ip in leaks.items():
            assert ifb_name(net, cid) not in after_ifbs
            assert not firewall_rules_of(ip) & after_rules
        assert web_ifb in after_ifbs and qdiscs(lab, web_ifb) == web_ifb_qdiscs
        assert firewall_rules_of(web_ip) <= after_rules
        assert after_rules == before_rules - set().union(*(firewall_rules_of(ip) for ip in leaks.values()))
        assert pings(lab, web)

        again = run_reaper(lab, "scan", tmp_path / "again.json", "--json", *SCAN)
        assert again.returncode == 0 and again.doc["summary"]["orphan"] == 0, again.stdout[-3000:]
