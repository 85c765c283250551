"""The Helm chart, rendered and linted by the real Helm v4 engine (helm-python-sdk's bundled libhelm_c).

Offline: no helm binary, no cluster, no network. Every rendered manifest is validated against the
Kubernetes JSON schemas kubernetes-validate ships; the prometheus-operator kinds, which those
schemas do not know, are checked structurally here. The container arguments are parsed by the
agent's own CLI, so a flag the chart passes and the agent does not take fails here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from reaper.cli import build_parser
from reaper.durations import parse_duration
from reaper.names import compile_netns_patterns
from reaper.runtime.discovery import KNOWN_SOCKETS
from reaper.settings import (
    DEL_CONCURRENCY,
    OPTIONS,
    agent_settings_from,
    reap_settings_from,
    settings_from,
    variable_texts,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "cni-reaper"
RULES = ROOT / "deploy" / "prometheus" / "cni-reaper-rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "cni-reaper-dashboard.json"
RELEASE = "cni-reaper"
NAMESPACE = "kube-system"
# Schemas the manifests must pass: a recent Kubernetes and the oldest one still commonly run.
KUBE_VERSIONS = ("1.30.0", "1.36.0")
PORT = 9753
OPENSHIFT_PORT = 19753  # outside the host ports 9000-9999 OpenShift reserves
# The chart refuses its placeholder image (cni-reaper, no tag): every render here names one.
IMAGE: dict[str, Any] = {"repository": "registry.example.com/cni-reaper"}

Manifest = dict[str, Any]

CUSTOM: dict[str, Any] = {
    "mode": "scan",
    "interval": "2m",
    "minAge": "30m",
    "confirmations": 3,
    "stuckAfter": "1h",
    "maxReap": 25,
    "maxOrphanRatio": 0.25,
    "method": "kernel",
    "pluginTimeout": "20s",
    "delConcurrency": 6,
    "allowPlugins": ["dhcp", "firewall"],
    "exclude": {"namespaces": ["kube-system"], "pods": ["monitoring/prometheus-*"], "networks": ["multus-*"]},
    "stallAfter": "45m",
    "force": True,
    "podCidrFromNode": True,
    "runtimeEndpoint": "unix:///var/run/crio/crio.sock",
    "runtimeTimeout": "5s",
    "netnsDirs": ["/var/run/netns", "/run/containerd/io.containerd.grpc.v1.cri/netns"],
    # The second holds the ',' a one-line REAPER_NETNS_PATTERN is split on.
    "netnsPatterns": ["test-[a-z0-9]+", "[0-9a-f]{8,64}"],
    "ipamDirs": ["/var/lib/cni/networks", "/srv/ipam"],
    "cniCacheDir": "/var/lib/cni",
    "cniConfDir": "/etc/kubernetes/cni/net.d",
    "cniBinDirs": ["/opt/cni/bin", "/usr/libexec/cni"],
    "stateFile": "/var/lib/reaper-state/state.json",
    "quarantineDir": "/var/lib/cni-quarantine",
    "quarantineMaxAge": "3d",
    "xtablesLock": "/var/run/xtables.lock",
    "logFormat": "text",
    "logLevel": "debug",
    # Appended last, so it wins over the chart's own --log-level.
    "extraArgs": ["--log-level=warning"],
    "metricsPort": 19753,
    "image": {"repository": "registry.example.com/cni-reaper", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "podAnnotations": {"example.com/team": "net"},
    "nodeSelector": {"node-role.kubernetes.io/worker": ""},
    "serviceAccount": {"create": False, "name": "reaper-sa"},
    "serviceMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "Kubernetes"}},
}
# The same, reclaiming: the CNI state is then writable and the quarantine dir mounted.
CUSTOM_REAP: dict[str, Any] = {**copy.deepcopy(CUSTOM), "mode": "reap"}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def with_image(values: dict[str, Any] | None) -> dict[str, Any]:
    """`values` (a copy), with an image when they name none."""
    given = copy.deepcopy(values) if values else {}
    given.setdefault("image", dict(IMAGE))
    return given


def render(chart: helm.Chart, values: dict[str, Any] | None = None) -> list[Manifest]:
    rendered = chart.render(with_image(values), name=RELEASE, namespace=NAMESPACE)
    docs: list[Manifest] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def one(docs: list[Manifest], kind: str) -> Manifest:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} rendered"
    return found[0]


def container(docs: list[Manifest]) -> Manifest:
    containers = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: Manifest = containers[0]
    return c


def setting_values(c: Manifest, flag: str) -> list[str]:
    """Every value the container gives `flag`, as the reaper reads them: the flag in its args,
    else its REAPER_* variable, split as the option splits it."""
    given = flag_values(c["args"], flag)
    if given:
        return given
    opt = next(o for o in OPTIONS if o.flag == flag)
    raw = {e["name"]: e.get("value") for e in c.get("env", [])}.get(opt.env or "")
    return variable_texts(opt, raw) if raw else []


def container_env(c: Manifest, **fields: str) -> dict[str, str]:
    """The container's variables as the kubelet gives them: `$(NAME)` of a variable defined
    before it replaced, the downward-API ones by `fields` (NODE_IP=..., NODE_NAME=...)."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        value = fields.get(e["name"], "") if "valueFrom" in e else str(e.get("value", ""))
        env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)
    return env


def flag_values(args: list[str], flag: str) -> list[str]:
    """Every value given to `flag`, as `--flag=value` or `--flag value`."""
    values = []
    for i, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            values.append(arg.split("=", 1)[1])
        elif arg == flag and i + 1 < len(args):
            values.append(args[i + 1])
    return values


def mounts_by_path(docs: list[Manifest]) -> dict[str, tuple[Manifest, Manifest]]:
    """mountPath -> (volumeMount, volume) of the agent's container."""
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    out: dict[str, tuple[Manifest, Manifest]] = {}
    for mount in container(docs)["volumeMounts"]:
        assert mount["mountPath"] not in out, f"two mounts at {mount['mountPath']}"
        out[mount["mountPath"]] = (mount, volumes[mount["name"]])
    return out


def host_mount(docs: list[Manifest], path: str) -> Manifest:
    """The mount of host path `path`, asserting it is mounted at the same path in the container."""
    mounts = mounts_by_path(docs)
    assert path in mounts, f"{path} not mounted; mounts: {sorted(mounts)}"
    mount, volume = mounts[path]
    assert volume["hostPath"]["path"] == path
    return mount


# --- lint and schema validation ------------------------------------------------------------


@pytest.mark.parametrize("values", [None, CUSTOM, CUSTOM_REAP], ids=["default", "custom-scan", "custom-reap"])
def test_helm_lint_is_clean(values: dict[str, Any] | None) -> None:
    report = helm.lint(CHART, with_image(values), strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    # Severity 1 is information (e.g. "icon is recommended"); 2 warning, 3 error.
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


def check_prometheus_operator(doc: Manifest) -> None:
    """Structural check of the prometheus-operator kinds (not in the Kubernetes schemas)."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert doc["metadata"]["name"]
    assert doc["metadata"]["namespace"] == NAMESPACE
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in doc["metadata"]["labels"].items())
    spec = doc["spec"]
    if doc["kind"] == "ServiceMonitor":
        assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels"}
        assert spec["selector"]["matchLabels"]
        assert spec["endpoints"]
        for endpoint in spec["endpoints"]:
            assert isinstance(endpoint["port"], str)
            assert endpoint["path"].startswith("/")
            for relabel in endpoint.get("relabelings", []):
                assert set(relabel) <= {"sourceLabels", "targetLabel", "action", "regex", "replacement", "separator"}
    elif doc["kind"] == "PrometheusRule":
        assert set(spec) == {"groups"}
        assert spec["groups"]
        names = [g["name"] for g in spec["groups"]]
        assert len(names) == len(set(names)), "group names must be unique"
        for group in spec["groups"]:
            assert set(group) <= {"name", "interval", "rules", "limit", "partial_response_strategy"}
            assert group["rules"]
            for rule in group["rules"]:
                assert ("alert" in rule) != ("record" in rule), rule
                assert set(rule) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
                assert isinstance(rule["expr"], str | int) and str(rule["expr"]).strip()
                if "for" in rule:
                    assert re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", rule["for"]), rule["for"]
                for key in ("labels", "annotations"):
                    assert all(isinstance(v, str) for v in rule.get(key, {}).values()), rule
    else:
        pytest.fail(f"unexpected kind {doc['kind']}")


@pytest.mark.parametrize("values", [None, CUSTOM, CUSTOM_REAP], ids=["default", "custom-scan", "custom-reap"])
def test_every_manifest_is_valid(chart: helm.Chart, values: dict[str, Any] | None) -> None:
    docs = render(chart, values)
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            check_prometheus_operator(doc)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                where = ".".join(str(p) for p in err.path)
                pytest.fail(f"{doc['kind']} invalid for Kubernetes {version} at {where}: {err.message}")


BAD_VALUES: list[dict[str, Any]] = [
    {"mode": "delete"},
    {"netnsDirs": ["var/run/netns"]},
    {"runtimeEndpoint": "tcp://127.0.0.1:1234"},
    {"maxOrphanRatio": 2},
    {"interval": "soon"},
    {"cniBinDirs": ["opt/cni/bin"]},
    {"method": "plugins"},
    {"allowPlugins": ["../bin/sh"]},
    {"exclude": {"pods": ["coredns"]}},
    {"exclude": {"namespace": ["kube-system"]}},
    {"stallAfter": "never"},
    {"cniPreset": "weave"},
    {"platform": "openshift4"},
    {"extraHostPaths": ["run/cni-ipam-state"]},
    {"runtimeSocketDirs": ["run/containerd"]},
    {"events": {"enabled": "yes"}},
    {"delConcurrency": 0},
    {"delConcurrency": 33},
    {"delConcurrency": "4"},
    {"netnsPatterns": ["pod-.*\nx"]},  # one regex a line in its variable: a newline would make two
]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=[next(iter(b)) for b in BAD_VALUES])
def test_values_schema_rejects_bad_values(chart: helm.Chart, bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.render(with_image(bad), name=RELEASE, namespace=NAMESPACE)


# --- the default rollout -------------------------------------------------------------------


def test_default_renders_the_agent_and_its_events_role(chart: helm.Chart) -> None:
    kinds = sorted(d["kind"] for d in render(chart))
    assert kinds == ["DaemonSet", "Role", "RoleBinding", "Service", "ServiceAccount"]


def test_daemonset_runs_on_every_node_privileged_in_host_namespaces(chart: helm.Chart) -> None:
    docs = render(chart)
    ds = one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["hostNetwork"] is True
    assert pod["hostPID"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["automountServiceAccountToken"] is True  # for the Events (events.enabled)
    assert 10 <= pod["terminationGracePeriodSeconds"] <= 60
    c = container(docs)
    assert c["securityContext"]["privileged"] is True
    assert c["securityContext"].get("runAsNonRoot") is not True
    # Nothing narrows privileged: a child joins pinned mount namespaces (setns: CAP_SYS_ADMIN,
    # CAP_SYS_CHROOT, and no seccomp profile that refuses setns).
    assert not {"capabilities", "seccompProfile", "appArmorProfile"} & c["securityContext"].keys()
    assert "seccompProfile" not in (pod.get("securityContext") or {})
    assert c["image"] == "registry.example.com/cni-reaper:0.1.0"  # tag defaults to appVersion
    assert c["resources"]["requests"] == {"cpu": "50m", "memory": "64Mi"}
    assert c["resources"]["limits"]["memory"] == "256Mi"
    # The Service selects the pods, by the port the probes and the agent use.
    service = one(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": PORT, "targetPort": "metrics", "protocol": "TCP"}]
    assert {"name": "metrics", "containerPort": PORT, "protocol": "TCP"} in c["ports"]


def test_the_del_concurrency_is_the_reapers_default_sized_to_the_memory_limit(chart: helm.Chart) -> None:
    """The chart's value is the binary's default, which bench/del_memory.py sized to the
    chart's 256 MiB: a change to either is a change to both."""
    c = container(render(chart))
    assert setting_values(c, "--del-concurrency") == [str(DEL_CONCURRENCY)]
    assert c["resources"]["limits"]["memory"] == "256Mi"


def test_pod_cidr_from_node_reads_only_nodes_with_the_pods_own_account(chart: helm.Chart) -> None:
    docs = render(chart, {"podCidrFromNode": True})
    role, binding = one(docs, "ClusterRole"), one(docs, "ClusterRoleBinding")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True and pod["serviceAccountName"] == account
    c = container(docs)
    assert setting_values(c, "--node-name") == ["$(NODE_NAME)"]
    node_name = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The agent's own resolver takes it, and NODE_NAME is defined before the variable uses it.
    env = container_env(c, NODE_IP="10.1.2.3", NODE_NAME="node-7")
    assert settings_from(build_parser().parse_args(c["args"]), env).node_name == "node-7"

    assert setting_values(c, "--pod-cidr-from-node") == []  # on, the agent's default

    off = render(chart, {"events": {"enabled": False}})
    assert not [d for d in off if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    assert one(off, "DaemonSet")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert setting_values(container(off), "--node-name") == []
    assert not [e for e in container(off)["env"] if e["name"] == "NODE_NAME"]


def test_events_may_be_posted_on_the_node_and_nothing_else(chart: helm.Chart) -> None:
    """On by default: a Role in `default` (where Events about a Node live), create and patch on
    events.k8s.io Events only, bound to the pod's own service account; no `get` on nodes."""
    docs = render(chart)
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role, binding = one(docs, "Role"), one(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "default"
    assert role["rules"] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True and pod["serviceAccountName"] == account
    c = container(docs)
    assert setting_values(c, "--events") == ["on"]
    assert setting_values(c, "--node-name") == ["$(NODE_NAME)"]
    node_name = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The agent posts Events on its node but never asks for the Node it may not get.
    parsed = build_parser().parse_args(c["args"])
    env = container_env(c, NODE_IP="10.1.2.3", NODE_NAME="node-7")
    assert agent_settings_from(parsed, env).events is True
    settings = settings_from(parsed, env)
    assert settings.node_name == "node-7" and settings.pod_cidr_from_node is False


def test_events_off_drops_the_role_and_with_pod_cidrs_keeps_the_node_read(chart: helm.Chart) -> None:
    off = render(chart, {"events": {"enabled": False}})
    assert setting_values(container(off), "--events") == ["off"]
    off_env = container_env(container(off), NODE_IP="10.1.2.3")
    assert agent_settings_from(build_parser().parse_args(container(off)["args"]), off_env).events is False
    both = render(chart, {"podCidrFromNode": True})
    assert sorted(d["kind"] for d in both if "Role" in d["kind"]) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ]
    only_cidrs = render(chart, {"podCidrFromNode": True, "events": {"enabled": False}})
    assert sorted(d["kind"] for d in only_cidrs if "Role" in d["kind"]) == ["ClusterRole", "ClusterRoleBinding"]
    assert setting_values(container(only_cidrs), "--node-name") == ["$(NODE_NAME)"]


def test_probes_hit_the_agents_health_endpoints(chart: helm.Chart) -> None:
    """No host and no other field: the kubelet connects to the pod IP, the node IP the agent
    listens on, from that same address, which has slots of its own in the agent (issue 23)."""
    c = container(render(chart))
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": PORT}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": PORT}


def test_default_args_and_listen_on_the_node_ip(chart: helm.Chart) -> None:
    c = container(render(chart))
    args = c["args"]
    assert args == ["run"], "every setting is a variable, which `kubectl exec ... reaper doctor` sees too"
    expected = {
        "--mode": ["scan"],  # a first install reports before it reclaims
        "--interval": ["60s"],
        "--listen": [f"$(NODE_IP):{PORT}"],
        "--runtime-endpoint": ["unix:///run/containerd/containerd.sock"],
        "--runtime-timeout": ["10s"],
        "--netns-dir": ["/var/run/netns"],
        "--netns-pattern": [],
        "--ipam-dir": ["/var/lib/cni/networks"],
        "--cni-cache-dir": ["/var/lib/cni"],
        "--cni-conf-dir": ["/etc/cni/net.d"],
        "--cni-bin-dir": ["/opt/cni/bin"],
        "--min-age": ["10m"],
        "--confirmations": ["2"],
        "--stuck-after": ["15m"],
        "--state-file": ["/var/lib/cni-reaper/state.json"],
        "--max-reap": ["100"],
        "--max-orphan-ratio": ["0.5"],
        "--method": ["auto"],
        "--plugin-timeout": ["60s"],
        "--allow-plugin": [],
        "--stall-after": ["30m"],
        "--quarantine-dir": [],
        "--quarantine-max-age": [],  # only with a quarantine dir; the agent's default is the chart's
        "--namespaces-dir": [],
        "--events-namespace": ["default"],
        "--log-format": ["json"],
        "--log-level": ["info"],
        "--events": ["on"],
        "--node-name": ["$(NODE_NAME)"],
        "--pod-cidr-from-node": ["off"],
    }
    for flag, values in expected.items():
        assert setting_values(c, flag) == values, flag
    assert "--force" not in args
    node_ip = next(e for e in c["env"] if e["name"] == "NODE_IP")
    assert node_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"


def test_the_default_mode_is_report_only_with_the_cni_state_read_only(chart: helm.Chart) -> None:
    docs = render(chart)
    assert setting_values(container(docs), "--mode") == ["scan"]
    assert host_mount(docs, "/var/run/netns")["mountPropagation"] == "HostToContainer"
    for ro in ("/var/run/netns", "/var/lib/cni"):
        assert host_mount(docs, ro)["readOnly"] is True, ro
    rendered = chart.render(with_image(None), name=RELEASE, namespace=NAMESPACE)
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    assert "Mode: scan (the default for a first install)" in notes and "--set mode=reap" in notes
    reaping = chart.render(with_image({"mode": "reap"}), name=RELEASE, namespace=NAMESPACE)
    assert "--set mode=scan" in next(text for path, text in reaping.items() if path.endswith("NOTES.txt"))


def test_reap_mode_host_mounts(chart: helm.Chart) -> None:
    docs = render(chart, {"mode": "reap"})
    netns = host_mount(docs, "/var/run/netns")
    # Unmounts of pins must reach the host, and pins made later must show up in the pod.
    assert netns["mountPropagation"] == "Bidirectional"
    assert not netns.get("readOnly")
    for rw in ("/var/lib/cni", "/var/lib/cni-reaper", "/run/containerd", "/run/xtables.lock"):
        assert not host_mount(docs, rw).get("readOnly"), rw
    for ro in ("/etc/cni/net.d", "/opt/cni/bin"):
        assert host_mount(docs, ro)["readOnly"] is True, ro
    mounts = mounts_by_path(docs)
    # /var/lib/cni/networks (the IPAM dir) is inside the /var/lib/cni mount already.
    assert "/var/lib/cni/networks" not in mounts
    # The socket's directory, so a runtime restart (a new socket inode) does not cut the agent off;
    # HostToContainer, so the runtime's own mounts under it are never held by the pod.
    assert "/run/containerd/containerd.sock" not in mounts
    assert mounts["/run/containerd"][1]["hostPath"]["type"] == "Directory"
    assert mounts["/run/containerd"][0]["mountPropagation"] == "HostToContainer"
    assert mounts["/run/xtables.lock"][1]["hostPath"]["type"] == "FileOrCreate"
    assert mounts["/var/lib/cni-reaper"][1]["hostPath"]["type"] == "DirectoryOrCreate"
    # Every other mount is a host path; the read-only root filesystem gets a writable /tmp.
    assert {p for p, (_, vol) in mounts.items() if "hostPath" not in vol} == {"/tmp"}


# What the chart gives the agent for a value left empty and no platform (values.yaml).
GENERIC: dict[str, Any] = {
    "runtimeEndpoint": "unix:///run/containerd/containerd.sock",
    "netnsDirs": ["/var/run/netns"],
    "ipamDirs": ["/var/lib/cni/networks"],
    "cniConfDir": "/etc/cni/net.d",
    "cniBinDirs": ["/opt/cni/bin"],
}


def test_args_are_what_the_agent_takes(chart: helm.Chart) -> None:
    """The rendered arguments, parsed by `reaper run`'s own parser, give the values' settings."""
    for values in (None, CUSTOM, CUSTOM_REAP):
        merged = chart.merge_values(with_image(values))
        merged.update({k: v for k, v in GENERIC.items() if not merged[k]})
        port = merged["metricsPort"] or PORT  # 0: the chart's default (no platform here)
        c = container(render(chart, values))
        args = c["args"]
        env = container_env(c, NODE_IP="10.1.2.3", NODE_NAME="node-7")
        parsed = build_parser().parse_args(args)
        settings = settings_from(parsed, env)
        reap = reap_settings_from(parsed, env)
        agent = agent_settings_from(parsed, env)
        assert agent.mode == merged["mode"]
        assert (agent.listen_host, agent.listen_port) == ("10.1.2.3", port)
        assert settings.find.netns_dirs == tuple(merged["netnsDirs"])
        assert settings.find.ipam_dirs == tuple(merged["ipamDirs"])
        assert settings.find.bin_dirs == tuple(merged["cniBinDirs"])
        assert settings.find.cache_dir == merged["cniCacheDir"]
        assert settings.find.conf_dir == merged["cniConfDir"]
        assert settings.find.netns_patterns == compile_netns_patterns(tuple(merged["netnsPatterns"]))
        assert settings.runtime_endpoints == (merged["runtimeEndpoint"],)
        assert settings.state_file == merged["stateFile"]
        assert settings.policy.confirmations == merged["confirmations"]
        assert reap.policy.max_reap == merged["maxReap"]
        assert reap.policy.max_orphan_ratio == merged["maxOrphanRatio"]
        assert reap.policy.kernel_only == (merged["method"] == "kernel")
        assert reap.policy.quarantine_dir == (merged["quarantineDir"] or None)
        assert reap.quarantine_max_age == parse_duration(merged["quarantineMaxAge"])
        assert reap.policy.force == merged["force"]
        assert reap.allow_plugins == tuple(merged["allowPlugins"])
        excluded = settings.policy.exclusions
        assert (excluded.namespaces, excluded.pods, excluded.networks) == tuple(
            tuple(merged["exclude"][k]) for k in ("namespaces", "pods", "networks")
        )
        assert agent.stall_after == parse_duration(str(merged["stallAfter"]))
        assert agent.events == merged["events"]["enabled"]
        assert agent.events_namespace == merged["events"]["namespace"]
        assert settings.pod_cidr_from_node == merged["podCidrFromNode"]
        assert settings.log_format == merged["logFormat"]
        assert settings.log_level == setting_values(c, "--log-level")[-1]  # extraArgs, if any, win


# --- non-default values --------------------------------------------------------------------


def test_custom_values_reach_the_args(chart: helm.Chart) -> None:
    args = container(render(chart, CUSTOM))
    assert setting_values(args, "--mode") == ["scan"]
    assert setting_values(args, "--listen") == ["$(NODE_IP):19753"]
    assert setting_values(args, "--interval") == ["2m"]
    assert setting_values(args, "--min-age") == ["30m"]
    assert setting_values(args, "--confirmations") == ["3"]
    assert setting_values(args, "--stuck-after") == ["1h"]
    assert setting_values(args, "--max-reap") == ["25"]
    assert setting_values(args, "--max-orphan-ratio") == ["0.25"]
    assert setting_values(args, "--method") == ["kernel"]
    assert setting_values(args, "--plugin-timeout") == ["20s"]
    assert setting_values(args, "--del-concurrency") == ["6"]
    assert setting_values(args, "--allow-plugin") == ["dhcp", "firewall"]
    assert setting_values(args, "--stall-after") == ["45m"]
    assert setting_values(args, "--runtime-endpoint") == ["unix:///var/run/crio/crio.sock"]
    assert setting_values(args, "--runtime-timeout") == ["5s"]
    assert setting_values(args, "--netns-dir") == CUSTOM["netnsDirs"]
    assert setting_values(args, "--netns-pattern") == CUSTOM["netnsPatterns"]
    assert not flag_values(args["args"], "--netns-pattern"), "a variable, which `kubectl exec ... reaper` reads too"
    assert setting_values(args, "--ipam-dir") == CUSTOM["ipamDirs"]
    assert setting_values(args, "--cni-conf-dir") == ["/etc/kubernetes/cni/net.d"]
    assert setting_values(args, "--cni-bin-dir") == ["/opt/cni/bin", "/usr/libexec/cni"]
    assert setting_values(args, "--state-file") == ["/var/lib/reaper-state/state.json"]
    assert setting_values(args, "--quarantine-dir") == ["/var/lib/cni-quarantine"]
    assert setting_values(args, "--quarantine-max-age") == ["3d"]
    assert setting_values(args, "--log-format") == ["text"]
    assert "--force" in args["args"]
    assert args["args"][-1] == "--log-level=warning"  # extraArgs come last


def test_custom_pod_settings(chart: helm.Chart) -> None:
    docs = render(chart, CUSTOM)
    pod = one(docs, "DaemonSet")["spec"]["template"]
    c = container(docs)
    assert c["image"] == "registry.example.com/cni-reaper:0.1.0-rc1"
    assert c["imagePullPolicy"] == "Always"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 19753}
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    # Helm merges maps: the default kubernetes.io/os selector stays unless set to null.
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux", "node-role.kubernetes.io/worker": ""}
    assert pod["spec"]["serviceAccountName"] == "reaper-sa"
    assert pod["metadata"]["annotations"]["example.com/team"] == "net"
    assert "ServiceAccount" not in {d["kind"] for d in docs}
    assert one(docs, "Service")["spec"]["ports"][0]["port"] == 19753


def test_scan_mode_mounts_nothing_writable_of_the_cni_state(chart: helm.Chart) -> None:
    docs = render(chart, CUSTOM)
    for netns_dir in CUSTOM["netnsDirs"]:
        mount = host_mount(docs, netns_dir)
        assert mount["readOnly"] is True
        assert mount["mountPropagation"] == "HostToContainer"
    for path in ("/var/lib/cni", "/srv/ipam", "/etc/kubernetes/cni/net.d", "/opt/cni/bin", "/usr/libexec/cni"):
        assert host_mount(docs, path)["readOnly"] is True, path
    # The confirmations are still counted; the quarantine dir is not needed.
    assert not host_mount(docs, "/var/lib/reaper-state").get("readOnly")
    assert "/var/lib/cni-quarantine" not in mounts_by_path(docs)
    assert host_mount(docs, "/var/run/crio")["mountPropagation"] == "HostToContainer"


def test_reap_mode_custom_mounts(chart: helm.Chart) -> None:
    docs = render(chart, CUSTOM_REAP)
    for netns_dir in CUSTOM["netnsDirs"]:
        mount = host_mount(docs, netns_dir)
        assert mount["mountPropagation"] == "Bidirectional"
        assert not mount.get("readOnly")
    for rw in (
        "/var/lib/cni",
        "/srv/ipam",
        "/var/lib/reaper-state",
        "/var/lib/cni-quarantine",
        "/var/run/xtables.lock",
    ):
        assert not host_mount(docs, rw).get("readOnly"), rw
    for ro in ("/etc/kubernetes/cni/net.d", "/opt/cni/bin", "/usr/libexec/cni"):
        assert host_mount(docs, ro)["readOnly"] is True, ro
    assert "/var/lib/cni/networks" not in mounts_by_path(docs)


def test_nested_paths_get_no_duplicate_mounts(chart: helm.Chart) -> None:
    values = {
        "quarantineDir": "/var/lib/cni-reaper/quarantine",
        "ipamDirs": ["/var/lib/cni/networks", "/var/lib/cni/networks/"],
        "cniBinDirs": ["/opt/cni/bin", "/opt/cni/bin"],
    }
    docs = render(chart, values)
    mounts = mounts_by_path(docs)  # asserts every mountPath is unique
    assert "/var/lib/cni-reaper/quarantine" not in mounts  # inside the writable state dir
    assert [p for p in mounts if p.startswith("/opt/cni")] == ["/opt/cni/bin"]
    assert setting_values(container(docs), "--quarantine-dir") == ["/var/lib/cni-reaper/quarantine"]


def test_one_host_path_with_two_needs_fails_clearly(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match="same host path /var/lib/cni"):
        chart.render(
            with_image({"runtimeEndpoint": "unix:///var/lib/cni/runtime.sock"}), name=RELEASE, namespace=NAMESPACE
        )


def test_service_monitor_scrapes_the_agents(chart: helm.Chart) -> None:
    docs = render(chart, CUSTOM)
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "30s"
    # The alert rules name the node by a `node` label.
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    } in endpoint["relabelings"]
    # CniReaperTargetDown and CniReaperTargetAbsent watch job "cni-reaper", whatever the release.
    assert {"targetLabel": "job", "replacement": "cni-reaper", "action": "replace"} in endpoint["relabelings"]


def test_prometheus_rule_is_the_rule_file(chart: helm.Chart) -> None:
    docs = render(chart, CUSTOM)
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    source = yaml.safe_load(RULES.read_text())
    assert source["groups"]
    assert rule["spec"]["groups"] == source["groups"]


def test_rule_file_is_a_relative_symlink_to_the_deploy_file() -> None:
    link = CHART / "files" / "cni-reaper-rules.yaml"
    assert link.is_symlink()
    target = Path(link.readlink())
    assert not target.is_absolute()
    assert link.resolve() == RULES.resolve()


def test_packaged_chart_holds_the_real_files(tmp_path: Path) -> None:
    """`helm package` follows the chart's symlinks into deploy/: the archive holds regular files
    with the linked files' contents, every file of the chart and nothing else, and renders the
    rule groups and the dashboard as the source files have them."""
    archive = Path(helm.package(CHART, destination=tmp_path))
    assert archive.name == "cni-reaper-0.1.0.tgz"
    expected = {
        f"cni-reaper/{path.relative_to(CHART)}": path.read_bytes()
        for path in CHART.rglob("*")
        if path.is_file() and path.name != ".helmignore"
    }
    assert "cni-reaper/files/cni-reaper-rules.yaml" in expected
    assert "cni-reaper/files/cni-reaper-dashboard.json" in expected
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        assert [m.name for m in members if not m.isfile()] == [], "no links or devices in the archive"
        held = {}
        for member in members:
            data = tar.extractfile(member)
            assert data is not None
            held[member.name] = data.read()
    held.pop("cni-reaper/.helmignore", None)
    # Chart.yaml is rewritten by helm (same fields, its own layout); every other file is as is.
    assert yaml.safe_load(held.pop("cni-reaper/Chart.yaml")) == yaml.safe_load(expected.pop("cni-reaper/Chart.yaml"))
    assert held == expected
    # The archive on its own, away from deploy/: it lints and renders what the sources say.
    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    report = helm.lint(unpacked / "cni-reaper", with_image(None), strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    enabled = {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
    with helm.Chart.load(archive) as packaged:
        docs = render(packaged, enabled)
    assert one(docs, "PrometheusRule")["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert one(docs, "ConfigMap")["data"]["cni-reaper.json"] == DASHBOARD.read_text()


@pytest.mark.parametrize(
    ("preset", "paths"),
    [
        ("none", set()),
        ("calico", {"/var/run/calico", "/var/lib/calico"}),
        ("cilium", {"/var/run/cilium"}),
        ("multus", {"/run/multus"}),
        ("flannel", {"/run/flannel"}),
        ("aws-vpc-cni", set()),
    ],
)
def test_a_cni_preset_mounts_what_its_del_needs(chart: helm.Chart, preset: str, paths: set[str]) -> None:
    default = set(mounts_by_path(render(chart)))
    for mode in ("reap", "scan"):
        docs = render(chart, {"cniPreset": preset, "mode": mode})
        mounts = mounts_by_path(docs)
        assert set(mounts) - default == paths
        for path in paths:
            assert bool(mounts[path][0].get("readOnly")) == (mode == "scan"), (path, mode)
        env = {e["name"]: e.get("value") for e in container(docs)["env"]}
        assert env["REAPER_CNI_PRESET"] == preset


# --- platform presets ----------------------------------------------------------------------


class Platform(NamedTuple):
    """What a platform preset must give the agent (PLATFORMS.md says where each path is from)."""

    sockets: dict[str, str]  # socket dir -> hostPath type (Directory: the pod waits for it)
    conf: str
    bins: list[str]
    ipam: list[str]
    state: list[str]  # plugin state and daemon socket dirs: writable, read-only in scan mode
    read_only: list[str] = []  # noqa: RUF012 (a NamedTuple default, never mutated)
    netns: str = "/var/run/netns"


CONTAINERD = {"/run/containerd": "Directory"}
DEFAULT_IPAM = ["/var/lib/cni/networks"]
PLATFORMS: dict[str, Platform] = {
    "kubeadm": Platform(
        {"/run/containerd": "DirectoryOrCreate", "/run/crio": "DirectoryOrCreate"},
        "/etc/cni/net.d",
        ["/opt/cni/bin"],
        DEFAULT_IPAM,
        [],
    ),
    "k3s": Platform(
        {"/run/k3s/containerd": "Directory"},
        "/var/lib/rancher/k3s/agent/etc/cni/net.d",
        ["/var/lib/rancher/k3s/data/cni"],
        DEFAULT_IPAM,
        [],
        read_only=["/var/lib/rancher/k3s/data"],
    ),
    "rke2": Platform({"/run/k3s/containerd": "Directory"}, "/etc/cni/net.d", ["/opt/cni/bin"], DEFAULT_IPAM, []),
    "microk8s": Platform(
        {"/var/snap/microk8s/common/run": "Directory"},
        "/var/snap/microk8s/current/args/cni-network",
        ["/var/snap/microk8s/current/opt/cni/bin"],
        DEFAULT_IPAM,
        [
            "/var/snap/microk8s/current/var/lib/calico",
            "/var/snap/microk8s/current/var/run/calico",
            "/var/snap/microk8s/common/var/lib/cni/flannel",
        ],
    ),
    "kind": Platform(CONTAINERD, "/etc/cni/net.d", ["/opt/cni/bin"], [*DEFAULT_IPAM, "/run/cni-ipam-state"], []),
    "openshift": Platform(
        {"/run/crio": "Directory"},
        "/etc/kubernetes/cni/net.d",
        ["/var/lib/cni/bin"],
        DEFAULT_IPAM,
        ["/run/multus", "/run/ovn-kubernetes"],
    ),
    "gke": Platform(CONTAINERD, "/etc/cni/net.d", ["/home/kubernetes/bin"], DEFAULT_IPAM, []),
    "eks": Platform(CONTAINERD, "/etc/cni/net.d", ["/opt/cni/bin"], DEFAULT_IPAM, []),
    "aks": Platform(CONTAINERD, "/etc/cni/net.d", ["/opt/cni/bin"], DEFAULT_IPAM, []),
    "talos": Platform(CONTAINERD, "/etc/cni/net.d", ["/opt/cni/bin"], DEFAULT_IPAM, []),
}


def covering_mount(docs: list[Manifest], path: str) -> Manifest:
    """The mount that makes host path `path` visible at the same path: its own, or a parent's."""
    for mount_path, (mount, volume) in mounts_by_path(docs).items():
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            assert volume["hostPath"]["path"] == mount_path
            return mount
    pytest.fail(f"{path} is not visible in the pod; mounts: {sorted(mounts_by_path(docs))}")


def test_every_platform_of_the_schema_has_a_tested_preset() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["platform"]["enum"]) == {"", *PLATFORMS}


@pytest.mark.parametrize("name", list(PLATFORMS))
def test_a_platform_preset_gives_its_dirs_and_mounts(chart: helm.Chart, name: str) -> None:
    want = PLATFORMS[name]
    for mode in ("reap", "scan"):
        docs = render(chart, {"platform": name, "mode": mode})
        c = container(docs)
        args = c["args"]
        # Discovery over the mounted socket dirs, not one pinned endpoint.
        assert setting_values(c, "--runtime-endpoint") == []
        assert setting_values(c, "--netns-dir") == [want.netns]
        assert setting_values(c, "--ipam-dir") == want.ipam
        assert setting_values(c, "--cni-conf-dir") == [want.conf]
        assert setting_values(c, "--cni-bin-dir") == want.bins
        settings = settings_from(build_parser().parse_args(args), container_env(c, NODE_IP="10.1.2.3"))
        assert settings.runtime_endpoints == ()
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["REAPER_PLATFORM"] == name
        mounts = mounts_by_path(docs)
        for path, kind in want.sockets.items():
            mount, volume = mounts[path]
            assert volume["hostPath"]["type"] == kind, path
            assert mount["mountPropagation"] == "HostToContainer" and not mount.get("readOnly"), path
            # A socket the agent's discovery looks for lives in each mounted socket dir.
            known = {os.path.dirname(p).replace("/var/run/", "/run/", 1) for _, p in KNOWN_SOCKETS}
            assert path in known, path
        netns = host_mount(docs, want.netns)
        assert netns["mountPropagation"] == ("HostToContainer" if mode == "scan" else "Bidirectional")
        for path in [*want.ipam, *want.state]:
            assert bool(covering_mount(docs, path).get("readOnly")) == (mode == "scan"), (path, mode)
        for path in [want.conf, *want.bins, *want.read_only]:
            assert covering_mount(docs, path).get("readOnly") is True or mode == "reap", path
        for path in want.read_only:
            assert host_mount(docs, path)["readOnly"] is True


@pytest.mark.parametrize("name", list(PLATFORMS))
def test_a_platform_preset_renders_valid_manifests(chart: helm.Chart, name: str) -> None:
    report = helm.lint(CHART, with_image({"platform": name}), strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    for doc in render(chart, {"platform": name, "cniPreset": "multus"}):
        kubernetes_validate.validate(doc, KUBE_VERSIONS[-1], strict=True)


def test_user_values_win_over_the_platform(chart: helm.Chart) -> None:
    values = {
        "platform": "k3s",
        "netnsDirs": ["/run/k3s/netns"],
        "ipamDirs": ["/srv/ipam"],
        "cniConfDir": "/etc/cni/k3s.d",
        "cniBinDirs": ["/usr/libexec/cni"],
        "extraHostPaths": ["/run/cni-state"],
    }
    docs = render(chart, values)
    args = container(docs)
    assert setting_values(args, "--netns-dir") == ["/run/k3s/netns"]
    assert setting_values(args, "--ipam-dir") == ["/srv/ipam"]
    assert setting_values(args, "--cni-conf-dir") == ["/etc/cni/k3s.d"]
    assert setting_values(args, "--cni-bin-dir") == ["/usr/libexec/cni"]
    mounts = mounts_by_path(docs)
    for path in ("/run/k3s/netns", "/srv/ipam", "/etc/cni/k3s.d", "/usr/libexec/cni", "/run/cni-state"):
        assert path in mounts, path
    for path in ("/var/run/netns", "/var/lib/rancher/k3s/agent/etc/cni/net.d"):
        assert path not in mounts, path
    # What the user did not set is still the platform's: its socket dir, found by discovery.
    assert "/run/k3s/containerd" in mounts
    assert setting_values(args, "--runtime-endpoint") == []

    # A pinned endpoint is the only runtime asked: only its dir is mounted.
    pinned = render(chart, {"platform": "kubeadm", "runtimeEndpoint": "unix:///run/crio/crio.sock"})
    assert setting_values(container(pinned), "--runtime-endpoint") == ["unix:///run/crio/crio.sock"]
    pinned_mounts = mounts_by_path(pinned)
    assert pinned_mounts["/run/crio"][1]["hostPath"]["type"] == "Directory"
    assert "/run/containerd" not in pinned_mounts

    # runtimeSocketDirs replaces the platform's socket dirs.
    dirs = render(chart, {"platform": "k3s", "runtimeSocketDirs": ["/run/containerd"]})
    dir_mounts = mounts_by_path(dirs)
    assert "/run/k3s/containerd" not in dir_mounts
    assert dir_mounts["/run/containerd"][0]["mountPropagation"] == "HostToContainer"


def test_no_platform_keeps_the_generic_layout(chart: helm.Chart) -> None:
    args = container(render(chart, {"platform": ""}))
    assert setting_values(args, "--runtime-endpoint") == [GENERIC["runtimeEndpoint"]]
    assert setting_values(args, "--cni-conf-dir") == [GENERIC["cniConfDir"]]
    env = {e["name"]: e.get("value") for e in container(render(chart))["env"]}
    assert env["REAPER_PLATFORM"] == ""


def test_an_unknown_platform_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.render(with_image({"platform": "minikube"}), name=RELEASE, namespace=NAMESPACE)


def test_doctor_exec_in_the_pod_sees_the_agents_settings(chart: helm.Chart) -> None:
    """`kubectl exec ds/cni-reaper -- reaper doctor` (or scan, explain) gets no flags, only the
    container's variables: they must resolve to what the agent itself runs with."""
    # One regex alone with a comma: the chart ends it with a newline, or ',' would split it.
    alone = {"netnsPatterns": ["[0-9a-f]{8,64}"]}
    for values in (None, CUSTOM, alone, {"platform": "k3s"}, {"platform": "openshift"}):
        c = container(render(chart, values))
        env = container_env(c, NODE_IP="10.1.2.3", NODE_NAME="node-7")
        agent = settings_from(build_parser().parse_args(c["args"]), env)
        patterns = tuple((values or {}).get("netnsPatterns", ()))
        assert agent.find.netns_patterns == compile_netns_patterns(patterns), values
        for command in (["doctor"], ["scan"], ["explain", "x"]):
            exec_ = settings_from(build_parser().parse_args(command), env)
            # Every dir, pod CIDR and netns pattern (one a line in REAPER_NETNS_PATTERN, commas and all).
            assert exec_.find == agent.find, (values, command)
            for field in ("runtime_endpoints", "runtime_timeout", "node_name"):
                assert getattr(exec_, field) == getattr(agent, field), (values, command, field)
            if command != ["doctor"]:  # doctor checks no grace, so its parser refuses those flags
                assert exec_.policy == agent.policy and exec_.state_file == agent.state_file


def test_alerts_link_their_runbook_section_absolutely_and_where_the_readme_is(chart: helm.Chart) -> None:
    """Every alert's runbook_url is absolute by default (a relative link is useless in a pager),
    and prometheusRule.runbookUrl moves them all to another copy of the README."""
    default = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookUrl"]
    assert default.startswith("https://") and default.endswith("/README.md")
    for base in (default, "https://github.com/acme/cni-reaper/blob/v0.1.0/README.md"):
        values = {"prometheusRule": {"enabled": True, **({} if base == default else {"runbookUrl": base})}}
        alerts = [r for g in one(render(chart, values), "PrometheusRule")["spec"]["groups"] for r in g["rules"]
                  if "alert" in r]  # fmt: skip
        assert alerts
        for alert in alerts:
            link, _, section = alert["annotations"]["runbook_url"].partition("#")
            assert link == base, alert["alert"]
            assert section in {a.lower().replace(" ", "-") for a in README_HEADINGS}, section
    for bad in ("javascript:alert(1)", "", "README.md", "https://x/README.md#leaks"):
        with pytest.raises(helm.HelmValuesError):
            render(chart, {"prometheusRule": {"enabled": True, "runbookUrl": bad}})


README_HEADINGS = [
    line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("### ")
]


# --- chart hygiene (issue 35) ----------------------------------------------------------------


def test_the_placeholder_image_is_refused_saying_what_to_set(chart: helm.Chart) -> None:
    """cni-reaper:0.1.0 names an image no registry serves: refused at render time, not found as
    ImagePullBackOff on every node; a repository or a tag of the user's renders."""
    with pytest.raises(helm.HelmRenderError, match=r"placeholder.*--set image\.repository=REGISTRY/cni-reaper"):
        chart.render(None, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(helm.HelmRenderError, match="placeholder"):
        chart.render({"image": {"pullPolicy": "Always"}}, name=RELEASE, namespace=NAMESPACE)
    assert container(render(chart, {"image": {"repository": "cni-reaper", "tag": "dev"}}))["image"] == "cni-reaper:dev"
    assert container(render(chart, {"image": {"repository": "ghcr.io/acme/cni-reaper"}}))["image"] == (
        "ghcr.io/acme/cni-reaper:0.1.0"
    )


MISSPELT: list[tuple[str, dict[str, Any]]] = [
    ("minage", {"minage": "30m"}),
    ("repo", {"image": {"repo": "registry.example.com/cni-reaper"}}),
    ("namespaces", {"events": {"enabled": True, "namespaces": "cni-reaper"}}),
    ("annotation", {"serviceAccount": {"annotation": {"a": "b"}}}),
    ("limit", {"resources": {"limit": {"memory": "1Gi"}}}),
    ("periodSecond", {"readinessProbe": {"periodSecond": 5}}),
    ("maxUnavailabe", {"updateStrategy": {"rollingUpdate": {"maxUnavailabe": 1}}}),
    ("operater", {"tolerations": [{"operater": "Exists"}]}),
    ("enable", {"serviceMonitor": {"enable": True}}),
    ("runbookURL", {"prometheusRule": {"runbookURL": "https://example.com/README.md"}}),
    ("annotation", {"service": {"annotation": {}}}),
    ("readonly", {"extraVolumeMounts": [{"name": "x", "mountPath": "/x", "readonly": True}]}),
]


@pytest.mark.parametrize(("key", "values"), MISSPELT, ids=[f"{k}-{next(iter(v))}" for k, v in MISSPELT])
def test_a_misspelt_key_at_any_level_is_refused_by_name(chart: helm.Chart, key: str, values: dict[str, Any]) -> None:
    """`minage: 30m` left --min-age at 10m with no word; now neither `helm lint` nor a render
    takes a key the schema does not know, and the error names it."""
    with pytest.raises(helm.HelmValuesError, match=f"additional properties '{key}' not allowed"):
        chart.render(with_image(values), name=RELEASE, namespace=NAMESPACE)
    report = helm.lint(CHART, with_image(values), strict=True, namespace=NAMESPACE)
    assert any(f"'{key}' not allowed" in e for e in report["errors"]), report["errors"]


def objects_not_strict(node: Any, where: str = "") -> list[str]:
    """Every object of the schema with properties of its own that takes keys it does not name."""
    found = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(where or "(top)")
        for key, sub in node.items():
            found += objects_not_strict(sub, f"{where}.{key}" if where else key)
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            found += objects_not_strict(sub, f"{where}[{i}]")
    return found


def test_every_object_of_the_values_schema_is_strict() -> None:
    """additionalProperties: false wherever the chart names the keys. Left open: a Volume's
    source (the Kubernetes API checks those, and the manifests are validated above)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert objects_not_strict(schema) == ["properties.extraVolumes.items"]
    # Every key of values.yaml is one the schema names (or the default lint above would fail).
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) <= set(schema["properties"])


def test_the_values_header_says_how_the_settings_reach_the_agent(chart: helm.Chart) -> None:
    """It said "an explicit argument (no REAPER_* variables)"; the template passes variables."""
    header = (CHART / "values.yaml").read_text().split("\n\n", 1)[0]
    assert "REAPER_* environment variable" in header and "no REAPER_*" not in header
    c = container(render(chart, CUSTOM))
    assert [a for a in c["args"] if a.startswith("--") and a != "--force"] == [*CUSTOM["extraArgs"]]
    assert {e["name"] for e in c["env"]} >= {"REAPER_MIN_AGE", "REAPER_MODE", "REAPER_INTERVAL"}


def test_the_events_role_is_in_the_namespace_given(chart: helm.Chart) -> None:
    docs = render(chart, {"events": {"enabled": True, "namespace": "cni-reaper"}})
    role, binding = one(docs, "Role"), one(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "cni-reaper"
    c = container(docs)
    assert setting_values(c, "--events-namespace") == ["cni-reaper"]
    env = container_env(c, NODE_IP="10.1.2.3", NODE_NAME="node-7")
    assert agent_settings_from(build_parser().parse_args(c["args"]), env).events_namespace == "cni-reaper"
    with pytest.raises(helm.HelmValuesError):
        render(chart, {"events": {"namespace": "Not_A_Namespace"}})


def test_quarantine_retention_reaches_the_agent(chart: helm.Chart) -> None:
    c = container(render(chart, {"mode": "reap", "quarantineDir": "/var/lib/cni-reaper/q", "quarantineMaxAge": "36h"}))
    assert setting_values(c, "--quarantine-max-age") == ["36h"]
    reap = reap_settings_from(build_parser().parse_args(c["args"]), container_env(c, NODE_IP="10.1.2.3"))
    assert reap.quarantine_max_age == 36 * 3600
    with pytest.raises(helm.HelmValuesError):
        render(chart, {"quarantineMaxAge": "a week"})


# --- OpenShift --------------------------------------------------------------------------------


def render_in(chart: helm.Chart, namespace: str, values: dict[str, Any]) -> tuple[list[Manifest], str]:
    """The manifests and NOTES.txt of a release in `namespace`."""
    rendered = chart.render(with_image(values), name=RELEASE, namespace=namespace)
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    docs = [d for path, text in rendered.items() if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text)]
    return [d for d in docs if d], notes


def test_openshift_lets_the_agent_use_the_privileged_scc(chart: helm.Chart) -> None:
    """A privileged, hostPID, hostNetwork pod with hostPath volumes outside the run-level
    namespaces is refused unless its service account may `use` the privileged SCC."""
    docs, _ = render_in(chart, "cni-reaper", {"platform": "openshift"})
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    (scc,) = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"]
    assert scc["metadata"]["namespace"] == "cni-reaper"
    assert scc["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:openshift:scc:privileged",
    }
    assert scc["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "cni-reaper"}]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSIONS[-1], strict=True)
    for name in set(PLATFORMS) - {"openshift"}:
        others = render(chart, {"platform": name})
        assert not [d for d in others if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"], name


def test_openshift_notes_say_to_install_into_a_namespace_of_its_own(chart: helm.Chart) -> None:
    _, notes = render_in(chart, "kube-system", {"platform": "openshift"})
    assert "WARNING: installed into kube-system" in notes
    assert "-n cni-reaper --create-namespace --set platform=openshift" in notes
    _, own = render_in(chart, "cni-reaper", {"platform": "openshift"})
    assert "WARNING" not in own and "system:openshift:scc:privileged" in own
    _, elsewhere = render_in(chart, "kube-system", {"platform": "kubeadm"})
    assert "WARNING" not in elsewhere


def test_openshift_metrics_port_is_outside_its_reserved_host_ports(chart: helm.Chart) -> None:
    for values, port in (
        ({"platform": "openshift"}, OPENSHIFT_PORT),
        ({"platform": "openshift", "metricsPort": 20123}, 20123),
        ({"platform": "kubeadm"}, PORT),
        ({"platform": "kubeadm", "metricsPort": 9100}, 9100),
    ):
        docs = render(chart, values)
        c = container(docs)
        assert setting_values(c, "--listen") == [f"$(NODE_IP):{port}"], values
        assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in c["ports"]
        assert c["readinessProbe"]["httpGet"]["port"] == c["livenessProbe"]["httpGet"]["port"] == port
        assert one(docs, "Service")["spec"]["ports"][0]["port"] == port
    with pytest.raises(helm.HelmRenderError, match=r"metricsPort 9753: OpenShift reserves host ports 9000-9999"):
        render(chart, {"platform": "openshift", "metricsPort": 9753})


CRIO_PIN_DIRS = ["/var/run/ipcns", "/var/run/utsns", "/var/run/userns", "/var/run/pidns"]


def test_openshift_mounts_crios_other_namespace_pins_like_the_netns_pins(chart: helm.Chart) -> None:
    """CRI-O pins a sandbox's ipc, uts and user namespaces (and pid, later) in
    <namespaces_dir>/<type>ns beside its netns pin (cri-o/cri-o internal/config/nsmgr/
    nsmgr_linux.go); OpenShift leaves namespaces_dir at CRI-O's default, /var/run."""
    for mode in ("reap", "scan"):
        docs = render(chart, {"platform": "openshift", "mode": mode})
        c = container(docs)
        assert setting_values(c, "--namespaces-dir") == ["/var/run"]
        settings = settings_from(build_parser().parse_args(c["args"]), container_env(c, NODE_IP="10.1.2.3"))
        assert settings.find.namespaces_dirs == ("/var/run",)
        netns = host_mount(docs, "/var/run/netns")
        for path in CRIO_PIN_DIRS:
            mount = host_mount(docs, path)
            assert mount.get("mountPropagation") == netns["mountPropagation"], (path, mode)
            assert bool(mount.get("readOnly")) == (mode == "scan") == bool(netns.get("readOnly")), (path, mode)
    for name in set(PLATFORMS) - {"openshift"}:
        docs = render(chart, {"platform": name})
        assert not set(CRIO_PIN_DIRS) & set(mounts_by_path(docs)), name
        assert setting_values(container(docs), "--namespaces-dir") == []
    given = render(chart, {"namespacesDirs": ["/run/crio-ns"], "netnsDirs": ["/run/crio-ns/netns"]})
    assert setting_values(container(given), "--namespaces-dir") == ["/run/crio-ns"]
    assert "/run/crio-ns/utsns" in mounts_by_path(given)


def deepest_mount(docs: list[Manifest], path: str) -> Manifest:
    """The mount that decides what the pod can do at host path `path`: the deepest that covers it."""
    covering = [
        (mount_path, mount)
        for mount_path, (mount, _) in mounts_by_path(docs).items()
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/")
    ]
    assert covering, f"{path} is not visible in the pod"
    return max(covering, key=lambda found: len(found[0]))[1]


# Values where a writable mount covers a plugin dir: the cache dir holding the bin dir (as on
# OpenShift), an extra host path above it.
BIN_UNDER_WRITABLE: list[dict[str, Any]] = [
    {"cniBinDirs": ["/var/lib/cni/bin", "/opt/cni/bin"]},
    {"extraHostPaths": ["/opt"]},
    {"platform": "k3s", "extraHostPaths": ["/var/lib/rancher/k3s"]},
]


@pytest.mark.parametrize("platform", ["", *PLATFORMS])
def test_no_plugin_dir_is_writable_in_any_preset(chart: helm.Chart, platform: str) -> None:
    """The plugins the agent runs as root come from the bin dirs: whatever mount covers one (in
    reap mode the read-write /var/lib/cni covered OpenShift's /var/lib/cni/bin), the pod sees
    it read-only, and the conf dir too, in every platform, CNI preset and mode."""
    cases = [{"cniPreset": preset} for preset in ("none", "calico", "cilium", "multus", "flannel", "aws-vpc-cni")]
    for values in [*cases, *BIN_UNDER_WRITABLE]:
        for mode in ("reap", "scan"):
            given = {"platform": platform, "mode": mode, **values}
            docs = render(chart, given)
            c = container(docs)
            bins = setting_values(c, "--cni-bin-dir")
            assert bins
            for path in [*bins, *setting_values(c, "--cni-conf-dir")]:
                assert deepest_mount(docs, path).get("readOnly") is True, (path, given)
