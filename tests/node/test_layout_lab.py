"""Zero flags on a k3s-shaped node: the lab's containerd serving on k3s' socket path, its CNI
configs and plugins in k3s' dirs, its pins under the state dir (netns_mounts_under_state_dir),
the libcni cache in /var/lib/cni. `reaper scan` with no dir or runtime flag finds the runtime,
every leak and the live pod, and says where each dir came from.

The reaper runs in the lab's netns and in a mount namespace of its own whose /run, /var/lib and
/etc/containerd are empty tmpfs holding only the k3s-shaped tree, bind-mounted from the lab:
the host's dirs are neither seen nor touched.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lab import Lab, Leak
from tests.harness.reap_helpers import SCAN

K3S_DATA = "/var/lib/rancher/k3s"
K3S_STATE = "/run/k3s/containerd"
K3S_SOCKET = f"{K3S_STATE}/containerd.sock"
K3S_CONF = f"{K3S_DATA}/agent/etc/cni/net.d"
K3S_BIN = f"{K3S_DATA}/data/cni"
K3S_NETNS = f"{K3S_STATE}/io.containerd.grpc.v1.cri/netns"
# What k3s' template renders (pkg/agent/templates, version 2), with pins under the state dir.
K3S_CONFIG = f"""version = 2
state = "{K3S_STATE}"
[plugins."io.containerd.grpc.v1.cri"]
  netns_mounts_under_state_dir = true
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{K3S_BIN}"
  conf_dir = "{K3S_CONF}"
"""


def _k3s_cache(lab: Lab, dest: Path) -> Path:
    """The lab's libcni cache as k3s' containerd would have written it: each entry's netns names
    the pin under the k3s netns dir, where the layout binds the lab's (the reaper looks up a
    cache entry's netns only in the netns dirs it was given, by path)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(lab.cache_dir, dest, symlinks=True)
    for entry in dest.rglob("*"):
        if entry.is_file() and not entry.is_symlink():
            text = entry.read_text(errors="surrogateescape")
            entry.write_text(text.replace(str(lab.netns_dir), K3S_NETNS), errors="surrogateescape")
    return dest


def _k3s_shaped(
    lab: Lab, config: Path, *reaper_args: str, command: str = "scan", leave_out: str = "", wrap: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    binds = {  # path in the k3s layout -> the lab's
        K3S_SOCKET: lab.endpoint.removeprefix("unix://"),
        K3S_CONF: str(lab.conf_dir),
        K3S_BIN: str(lab.bin_dir),
        K3S_NETNS: str(lab.netns_dir),
        "/var/lib/cni": str(_k3s_cache(lab, config.parent / "cni")),
        f"{K3S_DATA}/agent/etc/containerd/config.toml": str(config),
    }
    script = [f"mount -t tmpfs cni-reaper-test {d}" for d in ("/run", "/var/lib", "/etc/containerd")]
    for inside, outside in binds.items():
        if inside == leave_out:
            continue
        q = shlex.quote(inside)
        if Path(outside).is_dir():
            script.append(f"mkdir -p {q} && mount --rbind {shlex.quote(outside)} {q}")
        else:
            script.append(f"mkdir -p $(dirname {q}) && touch {q} && mount --bind {shlex.quote(outside)} {q}")
    reaper = [sys.executable, "-m", "reaper", command, *reaper_args]
    script.append("exec " + " ".join(shlex.quote(a) for a in reaper))
    argv = ["nsenter", f"--net={lab.netns_path}", *wrap, "unshare", "--mount", "--propagation", "private"]
    argv += ["sh", "-c", " && ".join(script)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def k3s_lab(lab: Lab, web: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Lab, str, Leak, Path]:
    tmp = tmp_path_factory.mktemp("k3s")
    config = tmp / "config.toml"
    config.write_text(K3S_CONFIG)
    leak = lab.make_leak(with_cache=True)
    return lab, web, leak, config


def test_scan_with_no_flags_finds_the_runtime_and_every_leak(k3s_lab: tuple[Lab, str, Leak, Path]) -> None:
    lab, web, leak, config = k3s_lab
    run = _k3s_shaped(lab, config, "--json", *SCAN, "--state-file", "/run/reaper-state.json")
    assert run.returncode == 1, run.stderr[-3000:]  # orphans found
    doc: dict[str, Any] = json.loads(run.stdout)
    (runtime,) = doc["runtimes"] if "runtimes" in doc else doc["runtime"]["runtimes"]
    assert K3S_SOCKET in json.dumps(runtime) and runtime["reachable"] is True
    dirs = doc["layout"]["dirs"]
    assert dirs["--cni-conf-dir"]["value"] == K3S_CONF and dirs["--cni-bin-dir"]["value"] == [K3S_BIN]
    assert dirs["--netns-dir"]["value"] == [K3S_NETNS]
    assert all(f"k3s ({K3S_DATA}/agent/etc/containerd/config.toml)" in d["from"] for d in dirs.values())
    verdicts = {a["container_id"]: a["verdict"] for a in doc["attachments"] if a["network"] == lab.network_name}
    assert verdicts[leak.container_id] == "orphan" and verdicts[web] == "live"
    kinds = {r["kind"] for a in doc["attachments"] if a["container_id"] == leak.container_id for r in a["resources"]}
    assert {"netns", "veth", "ipam", "cache", "iptables"} <= kinds, kinds


def test_a_flag_still_wins_over_the_layout(k3s_lab: tuple[Lab, str, Leak, Path]) -> None:
    lab, _, _, config = k3s_lab
    run = _k3s_shaped(lab, config, "--json", *SCAN, "--state-file", "/run/s.json", "--cni-conf-dir", "/run/none")
    doc: dict[str, Any] = json.loads(run.stdout)
    assert doc["layout"]["dirs"]["--cni-conf-dir"] == {"value": "/run/none", "from": "flag"}


def _statuses(run: subprocess.CompletedProcess[str]) -> dict[str, set[str]]:
    doc: dict[str, Any] = json.loads(run.stdout)
    found: dict[str, set[str]] = {}
    for check in doc["checks"]:
        found.setdefault(check["check"], set()).add(check["status"])
    return found


def test_doctor_passes_on_the_k3s_shaped_node(k3s_lab: tuple[Lab, str, Leak, Path]) -> None:
    lab, _, _, config = k3s_lab
    run = _k3s_shaped(lab, config, "--json", command="doctor")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    statuses = _statuses(run)
    assert statuses["runtime"] == {"ok"} and statuses["plugins"] == {"ok"}
    assert statuses["pid namespace"] == {"ok"} and statuses["conf dir"] == {"ok"}
    assert "fail" not in {s for found in statuses.values() for s in found}


def test_doctor_fails_with_the_fix_when_the_bin_dir_is_not_mounted(k3s_lab: tuple[Lab, str, Leak, Path]) -> None:
    lab, _, _, config = k3s_lab
    run = _k3s_shaped(lab, config, "--json", command="doctor", leave_out=K3S_BIN)
    assert run.returncode == 1
    failed = [c for c in json.loads(run.stdout)["checks"] if c["status"] == "fail"]
    assert {c["check"] for c in failed} == {"bin dir", "plugins"}
    assert all(c["fix"] for c in failed) and any("bridge" in c["message"] for c in failed)


def test_doctor_fails_without_the_hosts_pid_namespace(k3s_lab: tuple[Lab, str, Leak, Path]) -> None:
    lab, _, _, config = k3s_lab
    wrap = ("unshare", "--pid", "--fork", "--mount-proc")
    run = _k3s_shaped(lab, config, "--json", command="doctor", wrap=wrap)
    assert run.returncode == 1
    (pid,) = [c for c in json.loads(run.stdout)["checks"] if c["check"] == "pid namespace"]
    assert pid["status"] == "fail" and "hostPID" in pid["fix"]
