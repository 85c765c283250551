"""`reaper doctor`'s checks that are pure: the chart's preset and the pod CIDR against the node's
configs, and what the mount walk says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper import doctor
from reaper.cli import build_parser
from reaper.doctor import _cni_dirs, _dirs, _pod_cidrs, _preset
from reaper.host.nsmounts import NsMount
from reaper.kinds.netconf import collect_configs_of, parse_network_config
from reaper.layout import Layout
from reaper.model import NetworkConfig, NsKey
from reaper.podcidr import PodCidrs
from reaper.settings import settings_from


def _config(*types: str) -> NetworkConfig:
    doc = {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": t} for t in types]}
    return parse_network_config(json.dumps(doc).encode(), "/etc/cni/net.d/10-net.conflist")


@pytest.mark.parametrize(
    ("preset", "types", "status", "says"),
    [
        ("calico", ("calico", "portmap"), "ok", "matches"),
        ("cilium", ("calico", "portmap"), "warn", "use calico"),
        ("none", ("flannel", "portmap"), "warn", "cniPreset=flannel"),
        ("flannel", ("bridge",), "warn", "none of the presets"),
        ("weave", ("bridge",), "warn", "unknown cniPreset"),
    ],
)
def test_a_preset_that_does_not_match_the_node_is_reported(
    preset: str, types: tuple[str, ...], status: str, says: str
) -> None:
    (check,) = list(_preset(preset, [_config(*types)]))
    assert check.status == status and says in check.message + check.fix


def test_no_preset_and_none_on_a_plain_node_say_nothing() -> None:
    assert list(_preset(None, [_config("bridge")])) == []
    assert list(_preset("none", [_config("bridge", "portmap")])) == []


def test_a_use_pod_cidr_range_without_the_pod_cidr_is_a_warning_with_the_fix() -> None:
    ipam = {"type": "host-local", "ranges": [[{"subnet": "usePodCidr"}], [{"subnet": "usePodCidrIPv6"}]]}
    doc = {"cniVersion": "0.3.1", "name": "k8s-pod-network", "type": "calico", "ipam": ipam}
    calico = parse_network_config(json.dumps(doc).encode(), "/etc/cni/net.d/10-calico.conflist")
    args = build_parser().parse_args(["doctor"])
    unknown = settings_from(args, {})
    assert [(c.status, "--pod-cidr" in c.fix) for c in _pod_cidrs(unknown, [calico])] == [("warn", True)] * 2
    failed = replace(
        unknown, layout_problems=("pod CIDR: GET node n1: HTTP 403 (the service account may not get nodes)",)
    )
    assert all("HTTP 403" in c.message for c in _pod_cidrs(failed, [calico]))
    v4_only = replace(unknown, pod_cidrs=PodCidrs("10.244.3.0/24", None, "--pod-cidr"))
    checks = [(c.status, c.message) for c in _pod_cidrs(v4_only, [calico])]
    assert checks[0] == ("ok", "k8s-pod-network: usePodCidr is 10.244.3.0/24 (--pod-cidr)")
    assert checks[1][0] == "warn" and "usePodCidrIPv6" in checks[1][1]
    assert list(_pod_cidrs(unknown, [_config("bridge")])) == []


def test_doctor_lists_and_checks_every_conf_dir_and_reads_configs_from_each(tmp_path: Path) -> None:
    first, second = tmp_path / "crio", tmp_path / "kata"
    second.mkdir()
    (second / "10-kata.conf").write_text(json.dumps({"cniVersion": "1.0.0", "name": "kata", "type": "ptp"}))
    args = build_parser().parse_args(["doctor"])
    settings = replace(settings_from(args, {}), cni_conf_dir=str(first), more_conf_dirs=(str(second),))
    checks = [(c.name, c.status, c.message) for c in (*_dirs(settings, Layout()), *_cni_dirs(settings, []))]
    assert ("layout", "ok", f"--cni-conf-dir {first}:{second} (from default)") in checks
    assert ("conf dir", "fail", f"{first} does not exist here") in checks
    assert ("conf dir", "ok", f"{second} readable") in checks
    configs, _ = collect_configs_of(settings.cni_conf_dirs)
    assert [c.name for c in configs] == ["kata"]


def test_the_held_netns_check_fails_when_the_mounts_cannot_all_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    mount = NsMount(ns=NsKey(4, 9), pid=12, mount_ns=7, mount_point="/var/held", on=None)
    monkeypatch.setattr(doctor, "own_mount_namespace", lambda: 1)
    monkeypatch.setattr(doctor, "netns_mounts", lambda: [mount])
    check = doctor._held_mounts(("/run/netns",))
    assert check.status == "ok" and "1 network namespace" in check.message and "pid 12" in check.message

    def fails() -> list[NsMount]:
        raise OSError(5, "mount namespace mnt:[3] cannot be entered")

    monkeypatch.setattr(doctor, "netns_mounts", fails)
    check = doctor._held_mounts(("/run/netns",))
    assert check.status == "fail" and "cannot be entered" in check.message and "orphan" in check.message
