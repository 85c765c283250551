"""The Grafana dashboard: every query parses (promtool, as recording rules) and names only metrics
the agent exports; the chart ships the same file, off by default, for Grafana's sidecar."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from reaper.metrics import ReaperMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "cni-reaper-dashboard.json"
CHART = ROOT / "charts" / "cni-reaper"
PROMTOOL = shutil.which("promtool")

# Grafana's variables, as a user would pick them, so promtool sees plain PromQL.
NODE_LABELS = ("node", "instance")
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan",
}  # fmt: skip


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])  # inside collapsed rows


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    out = [(f"panel {p['id']} {t['refId']}", t["expr"]) for p in panels(doc) for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\S+)\)", var["definition"])
            assert match, var["definition"]
            out.append((f"variable {var['name']}", match.group(1)))
    return out


def concrete(expr: str, node_label: str) -> str:
    """The query with Grafana's variables filled in as a user would pick them."""
    expr = expr.replace("$node_label", node_label).replace("$node", ".*").replace("$cluster", ".*")
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"an unknown variable in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label matchers,
    ranges and by/without lists that are neither a function call nor a keyword."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![0-9A-Za-z_:.])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = match.group(0)
        if word.lower() in PROMQL_KEYWORDS or expr[match.end() :].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def exported_names() -> set[str]:
    """Every series name the agent's metrics registry exposes (the real one, unobserved: each
    family's `# TYPE` line is there even before a label set is)."""
    names = set()
    for line in ReaperMetrics(mode="reap").exposition().decode().splitlines():
        if not line.startswith("# TYPE "):
            continue
        _, _, name, kind = line.split()
        names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name})
    return names


def test_metric_names_reads_selectors_not_functions_labels_or_keywords() -> None:
    expr = (
        'sum by (node, kind) (increase(cni_reaper_reclaimed_total{kind="netns", node=~"a|b"}[5m])) > 0 '
        "or on (node) histogram_quantile(0.9, rate(x_bucket[1m])) / ignoring (le) up offset 5m"
    )
    assert metric_names(expr) == {"cni_reaper_reclaimed_total", "x_bucket", "up"}
    assert "cni_reaper_nope" not in exported_names()
    assert {"cni_reaper_runtime_up", "cni_reaper_passes_total", "cni_reaper_pass_duration_seconds_bucket"} <= (
        exported_names()
    )


def test_dashboard_covers_what_an_operator_watches() -> None:
    doc = dashboard()
    assert doc["uid"] == "cni-reaper" and doc["title"]
    used = {name for _, expr in queries(doc) for name in metric_names(concrete(expr, "node"))}
    for needed in (
        "cni_reaper_resources",  # leaks by node and kind
        "cni_reaper_reclaimed_total",
        "cni_reaper_reclaim_errors_total",
        "cni_reaper_ipam_range_used",
        "cni_reaper_ipam_range_size",
        "cni_reaper_pass_duration_seconds_bucket",
        "cni_reaper_runtime_up",
        "cni_reaper_breaker_open",
        "cni_reaper_network_orphans",  # where the leaks are, by network
        "cni_reaper_oldest_orphan_age_seconds",  # what CniReaperOldOrphans watches
        "cni_reaper_network_reclaimed_attachments_total",
        "cni_reaper_network_del_errors_total",
    ):
        assert needed in used, needed
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels(doc):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    # Every leak panel groups by the node label picked in the variable.
    leaks = next(
        p
        for p in panels(doc)
        if p.get("targets")
        and 'cni_reaper_resources{verdict="orphan", cluster=~"$cluster", $node_label' in p["targets"][0]["expr"]
    )
    assert "by ($node_label, kind)" in leaks["targets"][0]["expr"]
    # The network panels group by the node label and the (bounded) network label.
    for panel in panels(doc):
        for target in panel.get("targets", []):
            if "cni_reaper_network_" in target["expr"]:
                assert "by ($node_label, network)" in target["expr"], panel["title"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert [o["value"] for o in variables["node_label"]["options"]] == list(NODE_LABELS)


def test_fleet_panels_and_a_cluster_variable() -> None:
    """On 5,000 nodes a panel per node is 5,000 lines: the dashboard opens on the fleet (how many
    nodes leak, the worst nodes, sums), and every query is narrowed to the clusters picked."""
    doc = dashboard()
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    cluster = variables["cluster"]
    assert cluster["type"] == "query" and cluster["includeAll"] and cluster["allValue"] == ".*"
    assert cluster["definition"] == "label_values(cni_reaper_build_info, cluster)"
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names.index("cluster") < names.index("node"), "the node list is of the clusters picked"
    assert 'cluster=~"$cluster"' in variables["node"]["definition"]
    for where, expr in queries(doc):
        if where != "variable cluster":
            assert 'cluster=~"$cluster"' in expr, where
    rows = sorted((p["gridPos"]["y"], p["title"]) for p in doc["panels"] if p["type"] == "row")
    assert rows[0][1] == "Fleet", "the dashboard opens on the fleet"
    end = rows[1][0] if len(rows) > 1 else float("inf")
    fleet = [p for p in doc["panels"] if p["type"] != "row" and rows[0][0] < p["gridPos"]["y"] < end]
    assert fleet
    exprs = [" ".join(t["expr"].split()) for p in fleet for t in p["targets"]]
    assert any(e.startswith("count(") and 'verdict="orphan"' in e for e in exprs), "nodes with orphans"
    assert any(e.startswith("topk(") and 'verdict="orphan"' in e for e in exprs), "the worst nodes"
    assert any(e.startswith("sum(") and 'verdict="orphan"' in e for e in exprs), "the fleet's orphans"
    assert any("cni_reaper_build_info" in e and "by (mode)" in e for e in exprs), "nodes by mode"
    assert all("$node_label=~" not in e for e in exprs), "fleet panels are of every node picked by cluster"


def test_every_query_names_only_exported_metrics() -> None:
    exported = exported_names()
    for where, expr in queries(dashboard()):
        names = metric_names(concrete(expr, "node"))
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= exported, f"{where}: {sorted(names - exported)} are not exported by the agent"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")
@pytest.mark.parametrize("node_label", NODE_LABELS)
def test_every_query_passes_promtool_as_a_recording_rule(node_label: str, tmp_path: Path) -> None:
    assert PROMTOOL is not None
    found = queries(dashboard())
    rules = [
        {"record": f"cni_reaper_dashboard:query_{i}", "expr": concrete(expr, node_label)}
        for i, (_, expr) in enumerate(found)
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "cni-reaper-dashboard", "rules": rules}]}))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(found)} rules found" in check.stdout
    # The same check turns a broken query down.
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (("}]}]}))
    assert subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, timeout=60).returncode != 0


# --- the chart's copy -------------------------------------------------------------------------


def configmaps(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    # An image of the user's: the chart refuses to render its placeholder.
    given = {"image": {"repository": "registry.example.com/cni-reaper"}, **(values or {})}
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(given, name="cni-reaper", namespace="kube-system")
    texts = [text for path, text in rendered.items() if not path.endswith("NOTES.txt")]
    docs = [d for text in texts for d in yaml.safe_load_all(text) if d]
    return [d for d in docs if d["kind"] == "ConfigMap"]


def test_the_chart_ships_the_dashboard_only_when_asked() -> None:
    assert configmaps(None) == []
    (cm,) = configmaps({"grafanaDashboard": {"enabled": True}})
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "kube-system"
    assert cm["data"] == {"cni-reaper.json": DASHBOARD.read_text()}
    values = {"enabled": True, "label": "dashboards", "labelValue": "cni", "namespace": "monitoring",
              "annotations": {"grafana_folder": "Kubernetes"}}  # fmt: skip
    (cm,) = configmaps({"grafanaDashboard": values})
    assert cm["metadata"]["labels"]["dashboards"] == "cni"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Kubernetes"}
    # Grafana's {{node}} legends and $variables reach it untouched: the file is not a template.
    assert "{{$node_label}}" in cm["data"]["cni-reaper.json"]


@pytest.mark.parametrize(
    "bad",
    [{"enabled": "yes"}, {"label": "not a label"}, {"labelValue": 1}, {"namespace": "Bad_NS"}, {"dashboard": "x"}],
    ids=["enabled", "label", "labelValue", "namespace", "unknown-key"],
)
def test_values_schema_rejects_bad_dashboard_values(bad: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.render({"grafanaDashboard": bad}, name="cni-reaper", namespace="kube-system")


def test_chart_file_is_a_relative_symlink_to_the_deploy_file() -> None:
    link = CHART / "files" / "cni-reaper-dashboard.json"
    assert link.is_symlink()
    assert not Path(link.readlink()).is_absolute()
    assert link.resolve() == DASHBOARD.resolve()
