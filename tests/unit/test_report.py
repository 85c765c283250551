"""The report as JSON and as a table, for a scan and for each way a reap pass ends."""

from __future__ import annotations

import json
import re
from pathlib import Path

from msgspec.structs import replace

from reaper.model import VERDICTS, SkippedAttachment
from reaper.podcidr import PodCidrs
from reaper.report import layout_json, reap_json, reap_table, report_json, report_table
from tests.harness.reclaim_fakes import fake_settings
from tests.harness.results import LONG_NAME, TAKEN_AT, full_report, key, reap_result
from tests.harness.snapshots import cid


def test_report_json_carries_every_list_and_a_summary_by_verdict() -> None:
    report = full_report()
    doc = report_json(report)
    json.dumps(doc)  # plain JSON all the way down
    assert doc["summary"] == {v: report.count(v) for v in VERDICTS}
    assert [a["verdict"] for a in doc["attachments"]] == [a.verdict for a in report.attachments]
    first = doc["attachments"][0]
    assert first["container_id"] == cid(1) and first["owner"] == "cri"
    lease, link = first["resources"]
    assert lease == {"kind": "ipam", "name": "10.0.0.1", "age_seconds": 100.0, "network": "mynet"}
    assert "age_seconds" not in link, "no age for a resource the kernel keeps no time for"
    assert [r["skipped"] for r in doc["runtimes"]] == [False, True]
    assert doc["live_sandboxes"] == 1
    assert doc["stuck_sandboxes"][0]["resources"][0]["age_seconds"] == 50.0
    assert doc["corrupt"][0]["count"] == 2
    assert doc["errors"] == [{"source": "iptables", "error": "iptables-save: not found"}]
    assert doc["ipam_ranges"][0] == {"network": "mynet", "range": "10.0.0.0/24", "size": 254, "used": 64}
    assert doc["unconfirmed"][0]["why"] == "its key matches none"
    assert doc["foreign_netns"] == [{"name": "test", "path": "/run/netns/test", "pids": 1}]


def test_an_age_never_goes_negative() -> None:
    report = full_report()
    later = replace(report, taken_at=TAKEN_AT - 1000.0)
    assert report_json(later)["attachments"][0]["resources"][0]["age_seconds"] == 0.0


def test_the_table_shows_each_verdict_group_and_every_section() -> None:
    table = report_table(full_report())
    for heading in ("ORPHAN (1)", "PENDING (1)", "EXCLUDED (1)", "UNKNOWN (1)", "LIVE (1)"):
        assert heading in table
    assert "STUCK SANDBOXES (1)" in table and "kube-system/stuck-pod" in table
    assert "CORRUPT OR UNREADABLE FILES (2)" in table
    assert "SOURCES THAT FAILED (1)" in table
    assert "25.2% used" in table, "64 of 254"
    assert "0/0" in table and "0.0% used" in table, "an empty range divides by nothing"
    assert "UNCONFIRMED, NEVER TOUCHED (1)" in table
    assert "NOT CNI'S, NEVER TOUCHED (1 netns): test" in table
    assert "runtime: containerd 1.7 at unix:///run/containerd.sock, 3 sandboxes listed" in table
    assert "runtime: skipped at unix:///run/crio.sock" in table
    assert LONG_NAME not in table and "..." in table, "long names are elided"
    assert table.splitlines()[-1] == "attachments: " + ", ".join(f"{v} 1" for v in VERDICTS)


def test_the_table_says_when_the_runtime_is_unreachable() -> None:
    table = report_table(full_report(reachable=False))
    assert "runtime: FAILED at unix:///run/other.sock (flag): deadline exceeded" in table
    # The runtime's error is on its own line, once; the verdict line does not repeat it.
    assert "runtime: UNREACHABLE; no attachment can be called orphan" in table
    assert table.count("deadline exceeded") == 1
    assert "ORPHAN" not in table


def test_with_no_runtime_to_list_the_verdict_line_says_why() -> None:
    report = full_report(reachable=False)
    alone = replace(report.runtime, runtimes=(), error="no CRI socket found (tried /a.sock)")
    table = report_table(replace(report, runtime=alone))
    assert "runtime: UNREACHABLE (no CRI socket found (tried /a.sock)); no attachment" in table
    assert table.count("/a.sock") == 1


def test_layout_json_names_each_dir_and_where_it_came_from(tmp_path: Path) -> None:
    given = fake_settings(tmp_path, bin_dirs=("/opt/cni/bin",))
    settings = replace(
        given,
        find=replace(given.find, more_conf_dirs=("/etc/kata/net.d",)),
        origins=(("--cni-bin-dir", "containerd config"), ("--netns-dir", "default")),
        layout_problems=("no pod CIDR",),
    )
    doc = layout_json(settings)
    assert doc["conf_dirs"] == [settings.find.conf_dir, "/etc/kata/net.d"]
    assert doc["dirs"]["--cni-bin-dir"] == {"value": ["/opt/cni/bin"], "from": "containerd config"}
    assert doc["dirs"]["--netns-dir"]["value"] == [str(tmp_path / "netns")]
    assert doc["problems"] == ["no pod CIDR"] and doc["pod_cidrs"] is None
    cidrs = PodCidrs(v4="10.0.0.0/16", v6=None, source="node spec")
    with_cidrs = layout_json(replace(settings, find=replace(settings.find, pod_cidrs=cidrs)))
    assert with_cidrs["pod_cidrs"] == {"v4": "10.0.0.0/16", "v6": None, "from": "node spec"}


def test_reap_json_has_the_plan_what_was_freed_and_what_was_skipped() -> None:
    doc = reap_json(reap_result())
    json.dumps(doc)
    assert doc["breaker"] == {"open": False, "reason": None}
    assert "recheck_error" not in doc
    assert [p["config"] for p in doc["plan"]] == ["/var/lib/cni/results/mynet-1", None]
    assert doc["plan"][1]["config_note"] == "no kernel object proves the attachment"
    assert doc["plan"][0]["steps"] == [{"kind": "ipam", "name": "10.0.0.1", "method": "cni-del"}]
    failed = doc["reclaimed"][1]
    assert failed["needs_plugin"] == "calico-ipam"
    assert failed["plugin_errors"] == ["calico: DEL broke (code 11)"]
    assert [r["ok"] for r in failed["resources"]] == [True, False]
    assert doc["skipped"] == [{"container_id": cid(3), "network": "mynet", "reason": "over --max-reap 2; next pass"}]
    assert doc["timings"] == {"scan": 0.5, "kernel": 0.25}


def test_reap_json_of_an_open_breaker_and_a_lost_runtime() -> None:
    breaker = reap_json(reap_result(breaker_open=True, breaker_reason="3 of 4", plan=(), reclaimed=(), skipped=()))
    assert breaker["breaker"] == {"open": True, "reason": "3 of 4"}
    assert breaker["plan"] == [] and breaker["reclaimed"] == []
    lost = reap_json(reap_result(recheck_error="connection refused"))
    assert lost["recheck_error"] == "connection refused"


def test_reap_table_of_a_pass_that_reclaimed() -> None:
    table = reap_table(reap_result(), dry_run=False)
    assert "PLAN" not in table, "the plan is shown for a dry run only"
    assert "RECLAIMED (1 of 2 attachments completely)" in table
    lines = table.splitlines()
    assert any(line.startswith("  ok   ") and cid(1)[:12] in line for line in lines)
    assert any(line.startswith("  FAIL ") and cid(2)[:12] in line for line in lines)
    assert "LEFT: kept: calico-ipam may keep state" in table
    assert "NEEDS PLUGIN calico-ipam" in table
    assert "plugin DEL error: calico: DEL broke (code 11)" in table
    assert "SKIPPED (1)" in table and "over --max-reap 2; next pass" in table


def test_reap_table_of_a_dry_run_shows_the_plan() -> None:
    table = reap_table(reap_result(reclaimed=(), skipped=()), dry_run=True)
    assert "PLAN (dry run, nothing changed): 2 attachments" in table
    assert "config: /var/lib/cni/results/mynet-1" in table
    assert "config: none (kernel only)" in table
    assert "no kernel object proves the attachment" in table
    assert re.search(r"cni-del\s+ipam 10\.0\.0\.1", table)
    assert "RECLAIMED" not in table and "SKIPPED" not in table


def test_reap_table_of_an_open_breaker() -> None:
    result = reap_result(breaker_open=True, breaker_reason="3 of 4 look orphaned", plan=(), reclaimed=(), skipped=())
    table = reap_table(result, dry_run=False)
    assert "BREAKER OPEN: 3 of 4 look orphaned" in table
    assert "RECLAIMED" not in table


def test_reap_table_names_a_key_without_network() -> None:
    result = reap_result(skipped=(SkippedAttachment(replace(key(4), network=None), "stopping"),))
    assert f"{cid(4)[:12]}~ -: stopping" in reap_table(result, dry_run=False)
