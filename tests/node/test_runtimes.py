"""Every runtime on the node is asked: found with no flags, a decoy runtime listing nothing
never turns another runtime's sandboxes into orphans, and one that cannot answer stops the pass."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.lab import Lab
from tests.harness.reap_helpers import REAP, pings, reproduce_both_seeds
from tests.harness.reaper_cli import attachments_by_key, run_reaper_discovering

CONTAINERD_SOCK = "/run/containerd/containerd.sock"
CRIO_SOCK = "/run/crio/crio.sock"
CRI_DOCKERD_SOCK = "/run/cri-dockerd.sock"


@pytest.fixture(scope="module")
def labs() -> Iterator[tuple[Lab, Lab, str, str]]:
    """The pods' runtime (with a live pod and the seed sandbox CNI never set up: NOTREADY, no
    process in its netns) and a decoy containerd with CRI on and no pods."""
    with Lab() as lab, Lab() as decoy:
        _, nocni = reproduce_both_seeds(lab)
        web = lab.run_pod("web")
        yield lab, decoy, web, nocni


def dead_socket(path: Path) -> Path:
    """A socket file nobody listens on: a runtime that was stopped, or uninstalled."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    return path


def socket_of(lab: Lab) -> Path:
    return Path(lab.endpoint.removeprefix("unix://"))


def test_with_no_flags_every_runtime_is_asked_and_the_decoy_changes_nothing(
    labs: tuple[Lab, Lab, str, str], tmp_path: Path
) -> None:
    lab, decoy, web, nocni = labs
    sockets = {
        CONTAINERD_SOCK: socket_of(decoy),  # the first known socket: an empty list
        CRIO_SOCK: socket_of(lab),  # the pods' runtime, on CRI-O's path
        CRI_DOCKERD_SOCK: dead_socket(tmp_path / "dead.sock"),
    }
    state = tmp_path / "state.json"
    scan = run_reaper_discovering(lab, "scan", state, sockets, "--json", *REAP[:4])
    assert scan.returncode in (0, 1), scan.stderr
    runtimes = {r["endpoint"]: r for r in scan.doc["runtimes"]}
    assert set(runtimes) == {f"unix://{p}" for p in sockets}
    assert (
        runtimes[f"unix://{CONTAINERD_SOCK}"]["sandboxes"] == 0 and runtimes[f"unix://{CONTAINERD_SOCK}"]["reachable"]
    )
    assert runtimes[f"unix://{CRIO_SOCK}"]["sandboxes"] == len(lab.sandboxes())
    dead = runtimes[f"unix://{CRI_DOCKERD_SOCK}"]
    assert dead["skipped"] and not dead["reachable"] and "connection refused" in dead["error"]
    by_key = attachments_by_key(scan.doc)
    assert all(a["verdict"] == "live" for a in by_key.values() if a["container_id"] in (web, nocni))
    nocni_pin = lab.pod_netns_path(nocni)
    assert nocni_pin is not None

    reap = run_reaper_discovering(lab, "reap", state, sockets, "--json", *REAP)
    assert reap.returncode == 0, reap.stderr
    assert reap.doc["reclaimed"] == [] and nocni_pin.exists() and pings(lab, web)


class _Hangup(threading.Thread):
    """Something listening on a CRI path that hangs up on every call."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.close()


def test_a_runtime_that_cannot_answer_makes_the_pass_undecided(labs: tuple[Lab, Lab, str, str], tmp_path: Path) -> None:
    lab, _, web, _ = labs
    broken = _Hangup(tmp_path / "broken.sock")
    broken.start()
    try:
        sockets = {CONTAINERD_SOCK: tmp_path / "broken.sock", CRIO_SOCK: socket_of(lab)}
        run = run_reaper_discovering(lab, "reap", tmp_path / "state.json", sockets, "--json", *REAP)
    finally:
        broken.listener.close()
    assert run.returncode == 2, run.stdout + run.stderr
    assert "cannot decide" in run.stderr and run.doc["reclaimed"] == [] and pings(lab, web)
    failed = [r for r in run.doc["runtimes"] if not r["reachable"]]
    assert [r["endpoint"] for r in failed] == [f"unix://{CONTAINERD_SOCK}"] and not failed[0]["skipped"]


def test_the_kubelets_configured_endpoint_is_found(labs: tuple[Lab, Lab, str, str], tmp_path: Path) -> None:
    """A kubelet whose --container-runtime-endpoint is no known path: found through /proc."""
    lab, _, _, _ = labs
    custom = "/run/custom-runtime/cri.sock"
    name_it = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'kubelet', 0, 0, 0); time.sleep(120)"  # PR_SET_NAME
    kubelet = subprocess.Popen(
        [sys.executable, "-c", name_it, "--v=2", f"--container-runtime-endpoint=unix://{custom}"]
    )
    try:
        for _ in range(100):
            if Path(f"/proc/{kubelet.pid}/comm").read_text().strip() == "kubelet":
                break
            threading.Event().wait(0.05)
        run = run_reaper_discovering(lab, "scan", tmp_path / "state.json", {custom: socket_of(lab)}, "--json")
    finally:
        kubelet.kill()
        kubelet.wait()
    assert run.returncode in (0, 1), run.stderr
    (found,) = run.doc["runtimes"]
    assert found["endpoint"] == f"unix://{custom}" and found["reachable"]
    assert found["found_by"] == f"kubelet (pid {kubelet.pid}) --container-runtime-endpoint"
