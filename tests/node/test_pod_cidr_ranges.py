"""A Calico-style network (host-local with `"subnet": "usePodCidr"`) through the real command:
`reaper scan --pod-cidr` puts its range in the JSON report and the range gauges the "IP range
nearly full" alert reads; a pod CIDR that cannot be learnt is one problem line and no gauge
(never a size of 0, which the alert would read as full). Each run is in a network namespace
of its own (`unshare --net`), so nothing of the host's is read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.apiserver import TOKEN, make_pki

NETWORK = "k8s-pod-network"
# projectcalico/calico manifests/calico.yaml: the CNI config Calico installs with host-local
CALICO = {
    "name": NETWORK,
    "cniVersion": "0.3.1",
    "plugins": [
        {"type": "calico", "datastore_type": "kubernetes", "ipam": {"type": "host-local", "subnet": "usePodCidr"}},
        {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}},
    ],
}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    for sub in ("net.d", f"networks/{NETWORK}", "cni", "netns", "bin"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "net.d" / "10-calico.conflist").write_text(json.dumps(CALICO))
    for ip in ("10.244.3.2", "10.244.3.3", "10.244.9.9"):  # the last: outside this node's range
        (tmp_path / "networks" / NETWORK / ip).write_text(f"{'c' * 64}\r\neth0")
    return tmp_path


def scan(node: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, object], str, str]:
    d = str(node)
    argv = ["unshare", "--net", "--", sys.executable, "-m", "reaper", "scan", "--json",
            "--cni-conf-dir", f"{d}/net.d", "--ipam-dir", f"{d}/networks", "--cni-cache-dir", f"{d}/cni",
            "--netns-dir", f"{d}/netns", "--cni-bin-dir", f"{d}/bin", "--runtime-endpoint", f"unix://{d}/none.sock",
            "--state-file", f"{d}/state.json", "--textfile", f"{d}/metrics.prom", *flags]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    metrics = (node / "metrics.prom").read_text() if (node / "metrics.prom").exists() else ""
    return proc.returncode, doc, metrics, proc.stderr


def test_the_pod_cidr_range_is_gauged(node: Path) -> None:
    rc, doc, metrics, stderr = scan(node, "--pod-cidr", "10.244.3.0/24")
    assert rc == 2, stderr  # no runtime here: undecided, but the ranges are still read
    assert doc["ipam_ranges"] == [{"network": NETWORK, "range": "10.244.3.0/24", "size": 253, "used": 2}]
    assert doc["layout"]["pod_cidrs"] == {"v4": "10.244.3.0/24", "v6": None, "from": "--pod-cidr"}  # type: ignore[index]
    assert f'cni_reaper_ipam_range_size{{network="{NETWORK}",range="10.244.3.0/24"}} 253.0' in metrics
    assert f'cni_reaper_ipam_range_used{{network="{NETWORK}",range="10.244.3.0/24"}} 2.0' in metrics


def test_an_unknown_pod_cidr_is_a_problem_line_and_no_gauge(node: Path) -> None:
    sa = node / "sa"
    sa.mkdir()
    (sa / "token").write_text(TOKEN)
    (sa / "ca.crt").write_text("")
    # In a pod with a broken service-account mount, then with an API server that cannot be
    # reached (nothing listens in this netns).
    pod = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "6443",
        "REAPER_SERVICEACCOUNT_DIR": str(sa),
        "REAPER_NODE_NAME": "worker-3",
    }
    for ca, problem in (
        (b"", f"pod CIDR: {sa}/ca.crt is not a CA certificate"),
        (make_pki(node)[0].read_bytes(), "pod CIDR: the API server at 127.0.0.1:6443 did not answer"),
    ):
        (sa / "ca.crt").write_bytes(ca)
        rc, doc, metrics, stderr = scan(node, env=pod)
        assert rc == 2 and "Traceback" not in stderr, stderr
        assert doc["ipam_ranges"] == []
        (said,) = doc["layout"]["problems"]  # type: ignore[index]
        assert said.startswith(problem), said
        assert "ipam_range_size{" not in metrics

    rc, doc, _, stderr = scan(node, "--pod-cidr", "10.244.3.1/24")
    assert rc == 2 and doc == {} and "Traceback" not in stderr
    assert stderr.strip() == ("reaper: --pod-cidr='10.244.3.1/24': not a network in CIDR notation (like 10.244.3.0/24)")
