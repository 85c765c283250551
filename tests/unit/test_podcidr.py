"""The node's pod CIDRs: from --pod-cidr, or from the Node object over real TLS with the pod's
service account (a stand-in API server, tests/harness/apiserver.py); every failure is one
line and leaves the ranges that need it out of the gauges, never anything else."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.cli import build_parser
from reaper.kinds.hostlocal import HostLocalLease, range_usage
from reaper.kinds.netconf import parse_network_config
from reaper.kubeapi import MAX_SECRET_BYTES
from reaper.podcidr import (
    MAX_NODE_BYTES,
    PodCidrError,
    PodCidrs,
    from_api,
    node_pod_cidrs,
    resolve_pod_cidrs,
)
from reaper.settings import SettingsError, resolve, settings_from, with_pod_cidrs
from tests.harness.apiserver import ApiServer, api_server, node_doc
from tests.harness.drip_apiserver import drip_server
from tests.harness.fifo import raised_unless_it_waits
from tests.harness.probe import probe_argv
from tests.harness.probes import start_up

NODE = "worker-3.example"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with api_server(tmp_path_factory.mktemp("api")) as server:
        yield server


def test_the_nodes_pod_cidrs_are_read_with_the_service_account(api: ApiServer) -> None:
    api.serve_node(NODE, "10.244.3.0/24", "fd00:10:244:3::/64")
    api.seen.clear()
    cidrs = from_api(NODE, api.env())
    assert cidrs == PodCidrs("10.244.3.0/24", "fd00:10:244:3::/64", f"node {NODE}'s spec.podCIDRs")
    assert api.seen == [(f"/api/v1/nodes/{NODE}", "Bearer reaper-test-token")]


def test_an_older_node_with_only_spec_pod_cidr() -> None:
    doc = node_doc(NODE, "10.244.3.0/24")
    del doc["spec"]["podCIDRs"]  # type: ignore[attr-defined]
    assert node_pod_cidrs(doc, NODE).v4 == "10.244.3.0/24"


@pytest.mark.parametrize(
    ("env_change", "sa_change", "message"),
    [
        ({}, {"token": "someone-else"}, "HTTP 401 (the token was refused)"),
        ({}, {"token": "abc\r\nX-Injected: 1\n"}, "is not a bearer token"),
        ({}, {"ca.crt": "not a certificate"}, "is not a CA certificate"),
        ({}, {"ca.crt": None}, "cannot read"),
        ({"KUBERNETES_SERVICE_PORT": "1"}, {}, "did not answer"),
        ({"KUBERNETES_SERVICE_PORT": "443; rm -rf"}, {}, "is not a port"),
    ],
)
def test_each_failure_is_one_line(
    api: ApiServer, tmp_path: Path, env_change: dict[str, str], sa_change: dict[str, str | None], message: str
) -> None:
    api.serve_node(NODE, "10.244.3.0/24")
    sa_dir = tmp_path / "sa"
    sa_dir.mkdir()
    for name in ("token", "ca.crt"):
        value = sa_change.get(name, (api.sa_dir / name).read_text())
        if value is not None:
            (sa_dir / name).write_text(value)
    env = {**api.env(), "REAPER_SERVICEACCOUNT_DIR": str(sa_dir), **env_change}
    with pytest.raises(PodCidrError) as err:
        from_api(NODE, env, timeout=2)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_server_whose_certificate_the_ca_did_not_sign_is_refused(api: ApiServer, tmp_path: Path) -> None:
    with api_server(tmp_path) as other:  # another CA, the same token
        api.serve_node(NODE, "10.244.3.0/24")
        env = {**api.env(), "REAPER_SERVICEACCOUNT_DIR": str(other.sa_dir)}
        with pytest.raises(PodCidrError, match=r"did not answer.*CERTIFICATE_VERIFY_FAILED"):
            from_api(NODE, env, timeout=2)


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (403, b'{"kind":"Status"}', "may not get nodes"),
        (200, b"[" * 1000, "the answer is not a Node"),  # decoded as lightkube's Node: an array is none
        (200, b"{" * 1000, "not JSON"),
        (200, json.dumps({"kind": "Pod", "spec": {"podCIDR": "10.0.0.0/8"}}).encode(), "is not a Node"),
        (200, json.dumps(node_doc(NODE)).encode(), "has no spec.podCIDR"),
        (200, json.dumps(node_doc(NODE, "10.244.3.7/24")).encode(), "is not a network"),  # host bits set
        (200, json.dumps(node_doc(NODE, "$(reboot)")).encode(), "is not a network"),
        (200, json.dumps({**node_doc(NODE), "spec": {"podCIDRs": [1, 2]}}).encode(), "not a Node"),
        (200, json.dumps({**node_doc(NODE), "spec": {"podCIDRs": ["10.0.0.0/8"] * 3}}).encode(), "not a list"),
        (200, b" " * (MAX_NODE_BYTES + 1), "larger than"),
    ],
)
def test_what_the_api_answers_is_checked(api: ApiServer, status: int, body: bytes, message: str) -> None:
    api.routes[f"/api/v1/nodes/{NODE}"] = (status, body)
    with pytest.raises(PodCidrError, match=message):
        from_api(NODE, api.env(), timeout=5)


def test_a_server_that_never_answers_costs_the_timeout(api: ApiServer) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # the kernel accepts; nobody ever speaks TLS
    env = {**api.env(), "KUBERNETES_SERVICE_PORT": str(listener.getsockname()[1])}
    try:
        started = time.monotonic()
        with pytest.raises(PodCidrError, match="did not answer"):
            from_api(NODE, env, timeout=0.5)
        assert time.monotonic() - started < 5
    finally:
        listener.close()


@pytest.mark.parametrize("name", ["../../api/v1/secrets", "Worker", "a/b", "node?watch=1", "x" * 300, ""])
def test_a_hostile_node_name_is_refused_before_any_request(api: ApiServer, name: str) -> None:
    api.seen.clear()
    with pytest.raises(PodCidrError, match="is not a node name"):
        from_api(name, api.env())
    assert api.seen == []


def test_flags_win_and_nothing_is_asked_outside_a_pod(api: ApiServer) -> None:
    api.seen.clear()
    given = resolve_pod_cidrs(["fd00:9::/64", "10.9.0.0/16"], NODE, api.env())
    assert given == PodCidrs("10.9.0.0/16", "fd00:9::/64", "--pod-cidr")
    assert resolve_pod_cidrs([], NODE, {}) is None  # not in a pod: no API to ask
    assert resolve_pod_cidrs([], None, api.env()) is None  # no node name
    assert api.seen == []


def test_a_bad_pod_cidr_flag_is_a_settings_error() -> None:
    args = build_parser().parse_args(["scan", "--pod-cidr", "10.244.3.7/24"])
    with pytest.raises(SettingsError, match=r"^--pod-cidr='10.244.3.7/24': not a network"):
        resolve(args, {})


def test_the_range_gauge_of_a_pod_cidr_network_counts_its_leases(api: ApiServer) -> None:
    api.serve_node(NODE, "10.244.3.0/24")
    args = build_parser().parse_args(["scan"])
    settings = with_pod_cidrs(settings_from(args, {"REAPER_NODE_NAME": NODE}), {**api.env(), "REAPER_NODE_NAME": NODE})
    assert settings.find.pod_cidrs is not None and settings.layout_problems == ()
    calico = {"cniVersion": "0.3.1", "name": "k8s-pod-network", "type": "calico"}
    config = parse_network_config(
        json.dumps({**calico, "ipam": {"type": "host-local", "subnet": "usePodCidr"}}).encode(), "/x"
    )
    leases = [
        HostLocalLease(
            network="k8s-pod-network",
            ip=ip,
            container_id="c" * 64,
            ifname="eth0",
            path=f"/x/{ip}",
            data_dir="/x",
            mtime=0.0,
        )
        for ip in ("10.244.3.2", "10.244.3.9", "10.244.4.2")  # the last: not this node's range
    ]
    (gauge,) = range_usage([config], leases, settings.find.pod_cidrs)
    assert (gauge.network, gauge.range, gauge.size, gauge.used) == ("k8s-pod-network", "10.244.3.0/24", 253, 2)
    assert range_usage([config], leases, None) == []  # unknown: no gauge, never a size of 0

    api.routes.clear()  # the node is gone from the API: one problem line, no gauge
    failed = with_pod_cidrs(settings_from(args, {"REAPER_NODE_NAME": NODE}), {**api.env(), "REAPER_NODE_NAME": NODE})
    assert failed.find.pod_cidrs is None
    assert failed.layout_problems == (f"pod CIDR: GET node {NODE}: HTTP 404 (Not Found)",)


@pytest.mark.parametrize("kind", ["fifo", "huge", "dir", "nul"])
def test_a_hostile_service_account_file_is_one_line_and_never_blocks(api: ApiServer, tmp_path: Path, kind: str) -> None:
    """The kubelet writes these files (its `..data` links are followed, as every client does);
    still, a FIFO is not waited on, a huge file is not read whole, a dir or a NUL is no token."""
    api.serve_node(NODE, "10.244.3.0/24")
    sa_dir = tmp_path / "sa"
    sa_dir.mkdir()
    (sa_dir / "ca.crt").write_bytes((api.sa_dir / "ca.crt").read_bytes())
    token = sa_dir / "token"
    if kind == "fifo":
        os.mkfifo(token)
    elif kind == "huge":
        token.write_bytes(b"a" * (MAX_SECRET_BYTES + 1))
    elif kind == "dir":
        token.mkdir()
    else:
        token.write_bytes(b"reaper-test-token\0x")
    env = {**api.env(), "REAPER_SERVICEACCOUNT_DIR": str(sa_dir)}
    raised = raised_unless_it_waits(token, lambda: from_api(NODE, env, timeout=2))
    assert isinstance(raised, PodCidrError) and "\n" not in str(raised), raised
    assert ("is not a bearer token" if kind == "nul" else "cannot read") in str(raised), raised


def test_an_api_server_that_drips_bytes_costs_start_up_one_deadline(tmp_path: Path) -> None:
    """A byte every 0.2 s keeps every read under its timeout: with a deadline per read, the
    pod-CIDR lookup (and so start-up) waited as long as the server went on. One deadline for the
    whole call: start-up goes on with the problem line it has when the API is unreachable, and
    the connection is closed. In a process of its own, so that a lookup that never returns is a
    failure, not a hung test."""
    with drip_server(tmp_path) as server:
        env = {**server.env(), "REAPER_NODE_NAME": NODE}
        try:
            done = subprocess.run(
                probe_argv(start_up, json.dumps(env)),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            )
        except subprocess.TimeoutExpired:
            pytest.fail("the pod-CIDR lookup was still waiting after 60s for a server that drips bytes")
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        where = f"127.0.0.1:{server.port}"
        why = f"the API server at {where} did not answer in time (the call's deadline of 5s passed)"
        assert found == {"pod_cidrs": False, "problems": [f"pod CIDR: {why}"]}
        assert server.sent >= 3, "the server dripped a byte at a time, within every read's timeout"
        assert server.closed.wait(10), "the connection was closed"
