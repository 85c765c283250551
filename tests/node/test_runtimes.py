"""Every runtime on the node is asked: found with no flags (through a symlink too), a decoy
runtime listing nothing never turns another runtime's sandboxes into orphans, and one that
cannot answer (a crashed one included) stops the pass."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from reaper.runtime.cri import CriLiveness
from tests.harness.fake_cri import NotCri
from tests.harness.lab import Lab
from tests.harness.reap_helpers import REAP, pings
from tests.harness.reaper_cli import attachments_by_key, kubelet_argv, run_reaper_discovering

CONTAINERD_SOCK = "/run/containerd/containerd.sock"
CRIO_SOCK = "/run/crio/crio.sock"


@pytest.fixture(scope="module")
def decoy(new_lab: Callable[[], Lab]) -> Lab:
    """A decoy containerd with CRI on and no pods, beside the pods' runtime."""
    return new_lab()


# The pods' runtime keeps a live pod and the seed sandbox CNI never set up (NOTREADY, no
# process in its netns), with the decoy beside it, in every test here.
pytestmark = pytest.mark.usefixtures("seeds", "decoy")


def dead_socket(path: Path) -> Path:
    """A socket file nobody listens on: a runtime that was stopped, or uninstalled."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    return path


def socket_of(lab: Lab) -> Path:
    return Path(lab.endpoint.removeprefix("unix://"))


def test_with_no_flags_every_runtime_is_asked_and_the_decoy_changes_nothing(
    lab: Lab, decoy: Lab, web: str, seeds: tuple[str, str], tmp_path: Path
) -> None:
    """Issue 31 case 4: the node's runtime is reached only through a symlink at CRI-O's path
    (/var/run/crio/crio.sock, as k3s users link containerd's path to k3s' own), while a decoy
    that lists nothing answers at containerd's. The link is followed (everything on the way is
    root's) and the runtime asked once under both spellings of /run: nothing of its sandboxes,
    the NOTREADY one included, is reclaimed."""
    _, nocni = seeds
    sockets = {
        CONTAINERD_SOCK: socket_of(decoy),  # the first known socket: an empty list
        "/run/node-runtime/cri.sock": socket_of(lab),  # the pods' runtime, on no known path
    }
    links = {"/var/run/crio/crio.sock": "/run/node-runtime/cri.sock"}
    state = tmp_path / "state.json"
    scan = run_reaper_discovering(lab, "scan", state, sockets, "--json", *REAP[:4], links=links)
    assert scan.returncode in (0, 1), scan.stderr
    runtimes = {r["endpoint"]: r for r in scan.doc["runtimes"]}
    assert set(runtimes) == {f"unix://{CONTAINERD_SOCK}", f"unix://{CRIO_SOCK}"}
    assert (
        runtimes[f"unix://{CONTAINERD_SOCK}"]["sandboxes"] == 0 and runtimes[f"unix://{CONTAINERD_SOCK}"]["reachable"]
    )
    assert runtimes[f"unix://{CRIO_SOCK}"]["sandboxes"] == len(lab.sandboxes())
    by_key = attachments_by_key(scan.doc)
    assert all(a["verdict"] == "live" for a in by_key.values() if a["container_id"] in (web, nocni))
    nocni_pin = lab.pod_netns_path(nocni)
    assert nocni_pin is not None

    reap = run_reaper_discovering(lab, "reap", state, sockets, "--json", *REAP, links=links)
    assert reap.returncode == 0, reap.stderr
    assert reap.doc["reclaimed"] == [] and nocni_pin.exists() and pings(lab, web)


def test_a_crashed_runtime_beside_one_that_answers_makes_the_pass_wait(
    lab: Lab, decoy: Lab, web: str, seeds: tuple[str, str], tmp_path: Path
) -> None:
    """Issue 31 case 5: the node's runtime crashed (its socket file left, connections refused)
    while a decoy answers at another known path and lists nothing. The crashed runtime's
    sandboxes (the NOTREADY one with no process) are still its own: nothing is reclaimed, exit
    2, and the line names the socket and what the operator who knows it is gone can do."""
    _, nocni = seeds
    sockets = {CONTAINERD_SOCK: dead_socket(tmp_path / "dead.sock"), CRIO_SOCK: socket_of(decoy)}
    reap = run_reaper_discovering(lab, "reap", tmp_path / "state.json", sockets, "--json", *REAP)
    assert reap.returncode == 2, reap.stdout + reap.stderr
    assert "cannot decide" in reap.stderr and CONTAINERD_SOCK in reap.stderr and "--runtime-endpoint" in reap.stderr
    assert reap.doc["reclaimed"] == [] and pings(lab, web)
    nocni_pin = lab.pod_netns_path(nocni)
    assert nocni_pin is not None and nocni_pin.exists()
    (crashed,) = [r for r in reap.doc["runtimes"] if not r["reachable"]]
    assert crashed["endpoint"] == f"unix://{CONTAINERD_SOCK}" and not crashed["skipped"]
    assert "connection refused" in crashed["error"]
    doctor = run_reaper_discovering(lab, "doctor", tmp_path / "state.json", sockets, "--json")
    failed = [c for c in doctor.doc["checks"] if c["check"] == "runtime" and CONTAINERD_SOCK in c["message"]]
    assert [c["status"] for c in failed] == ["fail"] and "--runtime-endpoint" in failed[0]["fix"], doctor.stdout


def test_a_runtime_that_cannot_answer_makes_the_pass_undecided(lab: Lab, web: str, tmp_path: Path) -> None:
    broken = NotCri(tmp_path / "broken.sock")
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


def test_the_kubelets_configured_endpoint_is_found(lab: Lab, tmp_path: Path) -> None:
    """A kubelet whose --container-runtime-endpoint is no known path: found through /proc, in a
    pid namespace whose init is the reaper (the host's init a kubelet is compared with)."""
    custom = "/run/custom-runtime/cri.sock"
    kubelet = kubelet_argv("--v=2", f"--container-runtime-endpoint=unix://{custom}")
    run = run_reaper_discovering(
        lab, "scan", tmp_path / "state.json", {custom: socket_of(lab)}, "--json", kubelets=[kubelet]
    )
    assert run.returncode in (0, 1), run.stderr
    (found,) = run.doc["runtimes"]
    assert found["endpoint"] == f"unix://{custom}" and found["reachable"]
    assert re.fullmatch(r"kubelet \(pid \d+\) --container-runtime-endpoint", found["found_by"])


def test_a_kubelet_the_hosts_init_would_not_start_is_reported_and_not_asked(lab: Lab, web: str, tmp_path: Path) -> None:
    """Issue 23 case 4a: a process named kubelet in a mount namespace of its own points at a
    socket that is no CRI runtime. It is reported (scan's runtimes, doctor's warning), never
    connected to, and the pass stays decided."""
    not_cri = NotCri(tmp_path / "not-cri.sock")
    not_cri.start()
    evil = "/run/evil/cri.sock"
    sockets = {CONTAINERD_SOCK: socket_of(lab), evil: tmp_path / "not-cri.sock"}
    kubelet = kubelet_argv(
        f"--container-runtime-endpoint=unix://{evil}", prefix=["unshare", "--mount", "--propagation", "private"]
    )
    try:
        scan = run_reaper_discovering(lab, "scan", tmp_path / "state.json", sockets, "--json", kubelets=[kubelet])
        doctor = run_reaper_discovering(lab, "doctor", tmp_path / "state.json", sockets, "--json", kubelets=[kubelet])
    finally:
        not_cri.listener.close()
    assert scan.returncode in (0, 1), scan.stdout + scan.stderr
    assert "cannot decide" not in scan.stderr and scan.doc["runtime"]["reachable"]
    runtimes = {r["endpoint"]: r for r in scan.doc["runtimes"]}
    assert runtimes[f"unix://{CONTAINERD_SOCK}"]["reachable"]
    reported = runtimes[f"unix://{evil}"]
    assert reported["skipped"] and not reported["reachable"]
    assert reported["error"] == "not asked: it runs in another mount namespace than the host's (pid 1)"
    assert re.fullmatch(r"kubelet \(pid \d+\) --container-runtime-endpoint", reported["found_by"])
    assert any(a["container_id"] == web and a["verdict"] == "live" for a in attachments_by_key(scan.doc).values())
    warned = [c for c in doctor.doc["checks"] if c["check"] == "runtime" and evil in c["message"]]
    assert [c["status"] for c in warned] == ["warn"] and "not asked" in warned[0]["message"], doctor.stdout
    assert not_cri.accepted == 0


def test_the_cri_client_takes_a_netns_told_before_and_fails_closed_on_a_dead_runtime(
    lab: Lab, decoy: Lab, web: str, seeds: tuple[str, str], tmp_path: Path
) -> None:
    _, nocni = seeds
    liveness = CriLiveness((lab.endpoint, decoy.endpoint), 10.0)
    first = liveness.observe({})
    assert first.reachable, first.error
    assert {s.id for s in first.sandboxes} == {s.id for s in lab.sandboxes()} >= {web, nocni}
    told = {s.status_key: "/run/netns/told-before-" + s.id for s in first.sandboxes if s.status_key}
    again = liveness.observe(told)
    assert all(s.netns_path == "/run/netns/told-before-" + s.id for s in again.sandboxes), (
        "a netns path the runtime gave before is taken as given, not asked again"
    )
    dead = CriLiveness((lab.endpoint, f"unix://{dead_socket(tmp_path / 'dead.sock')}"), 10.0).observe({})
    assert not dead.reachable and dead.sandboxes == ()
    assert dead.error is not None and "dead.sock" in dead.error
