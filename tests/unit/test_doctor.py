"""`reaper doctor`'s checks that are pure: the chart's preset and the pod CIDR against the node's configs,
what the node's configs and runtimes keep that the reaper does not see (temp dirs as the host's root and
its own), and what the mount walk says."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper import doctor
from reaper.cli import build_parser
from reaper.doctor import Check, _cni_dirs, _dirs, _plugins, _pod_cidrs, _preset, _visibility, doctor_json
from reaper.host.nsmounts import HeldMounts, NsMount
from reaper.kinds.netconf import collect_configs_of, parse_network_config
from reaper.layout import Layout
from reaper.model import NetworkConfig, NsKey, RuntimeAnswer, RuntimeView
from reaper.podcidr import PodCidrs
from reaper.report import layout_json
from reaper.runtime.discovery import REFUSED
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
    v4_only = replace(unknown, find=replace(unknown.find, pod_cidrs=PodCidrs("10.244.3.0/24", None, "--pod-cidr")))
    checks = [(c.status, c.message) for c in _pod_cidrs(v4_only, [calico])]
    assert checks[0] == ("ok", "k8s-pod-network: usePodCidr is 10.244.3.0/24 (--pod-cidr)")
    assert checks[1][0] == "warn" and "usePodCidrIPv6" in checks[1][1]
    assert list(_pod_cidrs(unknown, [_config("bridge")])) == []


def test_doctor_lists_and_checks_every_conf_dir_and_reads_configs_from_each(tmp_path: Path) -> None:
    first, second = tmp_path / "crio", tmp_path / "kata"
    second.mkdir()
    (second / "10-kata.conf").write_text(json.dumps({"cniVersion": "1.0.0", "name": "kata", "type": "ptp"}))
    args = build_parser().parse_args(["doctor"])
    detected = settings_from(args, {})
    settings = replace(detected, find=replace(detected.find, conf_dir=str(first), more_conf_dirs=(str(second),)))
    checks = [(c.name, c.status, c.message) for c in (*_dirs(settings, Layout()), *_cni_dirs(settings, []))]
    assert ("layout", "ok", f"--cni-conf-dir {first}:{second} (from default)") in checks
    assert ("conf dir", "fail", f"{first} does not exist here") in checks
    assert ("conf dir", "ok", f"{second} readable") in checks
    configs, _ = collect_configs_of(settings.find.conf_dirs)
    assert [c.name for c in configs] == ["kata"]


def test_doctor_names_crio_s_namespaces_dir_and_where_it_came_from(tmp_path: Path) -> None:
    """CRI-O pins a sandbox's ipc/uts/user/pid namespaces beside its netns pins, and the
    reaper frees them with it: doctor names that dir, says where it came from, and whether it
    can be read. A node with none (containerd alone) gets no line."""
    args = build_parser().parse_args(["doctor"])
    plain = settings_from(args, {})
    names = [c.message for c in _dirs(plain, Layout())]
    assert not any("--namespaces-dir" in m for m in names), names
    pins = tmp_path / "crio-namespaces"
    given = settings_from(args, {"REAPER_NAMESPACES_DIR": str(pins)})
    checks = [(c.name, c.status, c.message) for c in (*_dirs(given, Layout()), *_cni_dirs(given, []))]
    assert ("layout", "ok", f"--namespaces-dir {pins} (from REAPER_NAMESPACES_DIR)") in checks
    assert ("namespaces dir", "warn", f"{pins} does not exist here") in checks
    # --json's layout names it too, with where it came from.
    assert layout_json(given)["dirs"]["--namespaces-dir"] == {"value": [str(pins)], "from": "REAPER_NAMESPACES_DIR"}
    pins.mkdir()
    checks = [(c.name, c.status, c.message) for c in _cni_dirs(given, [])]
    assert ("namespaces dir", "ok", f"{pins} readable") in checks


# --- what the node keeps that the reaper does not see (the chart's mounts) ------------------


def _network(name: str, *plugins: dict[str, object]) -> NetworkConfig:
    doc = {"cniVersion": "1.0.0", "name": name, "plugins": list(plugins)}
    return parse_network_config(json.dumps(doc).encode(), f"/etc/cni/net.d/10-{name}.conflist")


def _bind(path: Path) -> None:
    """A unix socket file at `path`, as a runtime leaves it (the file outlives the socket)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


def _roots(tmp_path: Path) -> tuple[Path, Path]:
    """(the host's root, the reaper's): the reaper sees the default cache and IPAM dirs."""
    host, here = tmp_path / "h", tmp_path / "c"
    host.mkdir()
    (here / "var/lib/cni/networks").mkdir(parents=True)
    return host, here


KINDNET = _network("kindnet", {"type": "ptp", "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state"}})
CRIO = (("cri-o", "/run/crio/crio.sock"), ("cri-o", "/var/run/crio/crio.sock"))


def _visible(
    host: Path,
    here: Path,
    configs: list[NetworkConfig],
    platform: str | None = None,
    cache_dir: str | None = None,
    **changes: object,
) -> list[Check]:
    settings = replace(settings_from(build_parser().parse_args(["doctor"]), {}), **changes)
    if cache_dir is not None:
        settings = replace(settings, find=replace(settings.find, cache_dir=cache_dir))
    return list(_visibility(settings, configs, platform, host_root=str(host), here_root=str(here), known=CRIO))


def _warnings(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status != "ok"]


def test_an_ipam_data_dir_not_mounted_is_one_warning_naming_the_chart_value(tmp_path: Path) -> None:
    host, here = _roots(tmp_path)
    (warning,) = _warnings(_visible(host, here, [KINDNET]))
    assert warning.name == "visibility" and warning.status == "warn"
    assert warning.message.startswith("ipam dataDir /run/cni-ipam-state of network kindnet is not visible here")
    assert warning.fix == "chart: add /run/cni-ipam-state to ipamDirs or extraHostPaths, or set platform=kind"
    # The pod already has the preset that mounts it: only the value is named.
    (given,) = _warnings(_visible(host, here, [KINDNET], "kind"))
    assert given.fix == "chart: add /run/cni-ipam-state to ipamDirs or extraHostPaths"
    # In doctor's JSON too, one entry.
    entries = [c for c in doctor_json([warning])["checks"] if c["status"] == "warn"]
    assert entries == [{"check": "visibility", "status": "warn", "message": warning.message, "fix": warning.fix}]
    (here / "run/cni-ipam-state").mkdir(parents=True)
    assert _warnings(_visible(host, here, [KINDNET])) == []


def test_on_the_host_itself_a_missing_dir_is_not_hidden(tmp_path: Path) -> None:
    """Where the host's root is this process' root (no pod), a dir missing is one not made yet."""
    _, here = _roots(tmp_path)
    assert _warnings(_visible(here, here, [KINDNET])) == []


def test_a_plugin_state_dir_not_mounted_is_a_warning(tmp_path: Path) -> None:
    host, here = _roots(tmp_path)
    microk8s = _network(
        "microk8s-flannel-network",
        {"type": "flannel", "dataDir": "/var/snap/microk8s/common/var/lib/cni/flannel", "delegate": {}},
    )
    thin = _network("multus-cni-network", {"type": "multus", "cniDir": "/run/multus-state", "delegates": []})
    messages = [(c.message.split(" is ")[0], c.fix) for c in _warnings(_visible(host, here, [microk8s, thin]))]
    assert messages == [
        (
            "flannel dataDir /var/snap/microk8s/common/var/lib/cni/flannel of network microk8s-flannel-network",
            "chart: add /var/snap/microk8s/common/var/lib/cni/flannel to extraHostPaths, or set platform=microk8s",
        ),
        (
            "multus cniDir /run/multus-state of network multus-cni-network",
            "chart: add /run/multus-state to extraHostPaths",
        ),
    ]


def test_a_default_state_dir_under_the_cache_dir_is_seen_once_made(tmp_path: Path) -> None:
    """flannel's and multus' defaults are under the cache dir: not made yet is not unmounted."""
    host, here = _roots(tmp_path)
    configs = [_network("cbr0", {"type": "flannel", "delegate": {}}), _network("m", {"type": "multus-shim"})]
    assert _warnings(_visible(host, here, configs)) == []
    # The cache dir itself not visible: both are named, at their default paths.
    dirs = [c.message.split(" of ")[0] for c in _warnings(_visible(host, here, configs, cache_dir="/srv/cni"))]
    assert dirs == ["flannel dataDir /srv/cni/flannel", "multus-shim cniDir /srv/cni/multus"]


def test_a_runtime_socket_on_the_host_not_mounted_is_one_warning(tmp_path: Path) -> None:
    host, here = _roots(tmp_path)
    _bind(host / "run/crio/crio.sock")
    (host / "var").mkdir()
    (host / "var/run").symlink_to("../run")  # one socket under both spellings: one warning
    (warning,) = _warnings(_visible(host, here, []))
    assert warning.message == (
        "runtime socket /run/crio/crio.sock (cri-o) is on the host but not visible here: that runtime is not asked"
    )
    assert warning.fix == ("chart: add /run/crio to runtimeSocketDirs, or set platform=openshift or platform=kubeadm")
    pinned = ("unix:///run/containerd/containerd.sock",)
    (warning,) = _warnings(_visible(host, here, [], "kubeadm", runtime_endpoints=pinned))
    assert "leave it unset" in warning.message and "platform=" not in warning.fix
    # Mounted under the other spelling of /run: seen.
    _bind(here / "var/run/crio/crio.sock")
    assert _warnings(_visible(host, here, [])) == []


def test_nothing_is_warned_when_everything_is_visible(tmp_path: Path) -> None:
    host, here = _roots(tmp_path)
    for root in (host, here):
        _bind(root / "run/crio/crio.sock")
        (root / "run/cni-ipam-state").mkdir(parents=True)
        (root / "run/multus-state").mkdir(parents=True)
    configs = [
        KINDNET,
        _network("cbr0", {"type": "flannel", "delegate": {}}),
        _network("m", {"type": "multus", "cniDir": "/run/multus-state/"}),
    ]
    checks = _visible(host, here, configs, "kind")
    assert [(c.name, c.status) for c in checks] == [("visibility", "ok")]


def test_calico_state_moved_by_its_config_is_looked_for_there() -> None:
    """microk8s' Calico keeps its nodename under /var/snap: that dir is named, with the platform
    preset that mounts it, not the cniPreset that mounts /var/lib/calico."""
    snap = "/var/snap/microk8s/current/var/lib/calico"
    calico = _network("k8s-pod-network", {"type": "calico", "nodename_file": f"{snap}/nodename"})
    settings = settings_from(build_parser().parse_args(["doctor"]), {})
    (warning,) = [c for c in _plugins(settings, [calico]) if c.status == "warn"]
    assert f"calico's DEL needs {snap}, not here" in warning.message
    assert warning.fix == f"chart: add {snap} to extraHostPaths, or set platform=microk8s"
    if not os.path.exists("/var/lib/calico"):  # this machine's own Calico would satisfy it
        plain = _network("k8s-pod-network", {"type": "calico"})
        (default,) = [c for c in _plugins(settings, [plain]) if c.status == "warn"]
        assert default.fix == "mount /var/lib/calico (chart: cniPreset=calico)"


def test_the_held_netns_check_fails_when_the_mounts_cannot_all_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    mount = NsMount(ns=NsKey(4, 9), pid=12, mount_ns=7, mount_point="/var/held", on=None)
    monkeypatch.setattr(doctor, "held_mounts", lambda dirs: HeldMounts(held={mount.ns: (mount,)}, shared={}))
    check = doctor._held_mounts(("/run/netns",))
    assert check.status == "ok" and "1 network namespace" in check.message and "pid 12" in check.message

    def fails(dirs: tuple[str, ...]) -> HeldMounts:
        raise OSError(5, "mount namespace mnt:[3] cannot be entered")

    monkeypatch.setattr(doctor, "held_mounts", fails)
    check = doctor._held_mounts(("/run/netns",))
    assert check.status == "fail" and "cannot be entered" in check.message and "orphan" in check.message


def _answer(endpoint: str, error: str, skipped: bool = False) -> RuntimeAnswer:
    return RuntimeAnswer(
        endpoint=endpoint, source="--runtime-endpoint", name=None, version=None, reachable=False, error=error,
        sandboxes=0, skipped=skipped,
    )  # fmt: skip


@pytest.mark.parametrize(
    "answers",
    [
        (_answer("unix:///x.sock", "no socket at /x.sock"),),
        (_answer("unix:///a.sock", "Version on unix:///a.sock: DEADLINE_EXCEEDED"),
         _answer("unix:///b.sock", "Version on unix:///b.sock: UNAVAILABLE")),
        (_answer("unix:///c.sock", f"could not be asked: {REFUSED}"),),
    ],
)  # fmt: skip
def test_no_fix_line_repeats_an_error(answers: tuple[RuntimeAnswer, ...]) -> None:
    """Issue 35: with no runtime answering, the summary's fix was the runtime's error again."""
    error = "; ".join(a.error or "" for a in answers)
    view = RuntimeView(
        endpoint="", name=None, version=None, reachable=False, error=error, sandboxes=(), runtimes=answers
    )
    checks = list(doctor._runtimes(view, Layout()))
    assert checks[-1].message == "no runtime answers: every pass would be undecided"
    for check in checks:
        assert check.fix and not any(check.fix in other.message for other in checks), check
        assert not any(a.error and a.error in check.fix for a in answers), check
