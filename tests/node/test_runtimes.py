"""Every runtime on the node is asked: found with no flags, a decoy runtime listing nothing
never turns another runtime's sandboxes into orphans, and one that cannot answer stops the pass."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lab import Lab
from tests.harness.reap_helpers import REAP, pings, reproduce_both_seeds
from tests.harness.reaper_cli import attachments_by_key, kubelet_argv, run_reaper_discovering

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
    """Something listening on a CRI path that hangs up on every call (and counts them)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.accepted = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
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
    """A kubelet whose --container-runtime-endpoint is no known path: found through /proc, in a
    pid namespace whose init is the reaper (the host's init a kubelet is compared with)."""
    lab, _, _, _ = labs
    custom = "/run/custom-runtime/cri.sock"
    kubelet = kubelet_argv("--v=2", f"--container-runtime-endpoint=unix://{custom}")
    run = run_reaper_discovering(
        lab, "scan", tmp_path / "state.json", {custom: socket_of(lab)}, "--json", kubelets=[kubelet]
    )
    assert run.returncode in (0, 1), run.stderr
    (found,) = run.doc["runtimes"]
    assert found["endpoint"] == f"unix://{custom}" and found["reachable"]
    assert re.fullmatch(r"kubelet \(pid \d+\) --container-runtime-endpoint", found["found_by"])


def test_a_kubelet_the_hosts_init_would_not_start_is_reported_and_not_asked(
    labs: tuple[Lab, Lab, str, str], tmp_path: Path
) -> None:
    """Issue 23 case 4a: a process named kubelet in a mount namespace of its own points at a
    socket that is no CRI runtime. It is reported (scan's runtimes, doctor's warning), never
    connected to, and the pass stays decided."""
    lab, _, web, _ = labs
    not_cri = _Hangup(tmp_path / "not-cri.sock")
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


# A fresh process: the forked client is for processes that have not imported grpc (a child
# forked from one that has may inherit grpc's threads' locks). It compares the forked client's
# views with the in-process client's, asked right after, on the same runtimes.
FORKED_PROBE = """
import json, os, signal, sys, time
from reaper.runtime.forked import ForkedLiveness
endpoints = tuple(sys.argv[1:])
out = {}
with ForkedLiveness(endpoints, 10.0) as liveness:
    first = liveness.observe({})
    told = {s.status_key: "/run/netns/told-before-" + s.id for s in first.sandboxes if s.status_key}
    again = liveness.observe(told)  # the same child, a second request
    out["grpc_here"] = sorted(m for m in sys.modules if m.startswith(("grpc", "google.protobuf")))
    child = liveness.pid
    os.kill(child, signal.SIGKILL)
    dead = liveness.observe({})
out["child_left"] = os.path.exists(f"/proc/{child}")
from reaper.runtime.cri import CriLiveness
direct = CriLiveness(endpoints, 10.0).observe({})
from msgspec.structs import replace
def in_order(view):  # containerd lists sandboxes from a map: in another order each time
    return replace(view, sandboxes=tuple(sorted(view.sandboxes, key=lambda s: s.id)))
out["same_as_in_process"] = in_order(first) == in_order(direct)
out["first"] = {"reachable": first.reachable, "error": first.error, "ids": sorted(s.id for s in first.sandboxes)}
out["told_used"] = all(s.netns_path == "/run/netns/told-before-" + s.id for s in again.sandboxes)
out["dead"] = {"reachable": dead.reachable, "error": dead.error, "pid": child}
print(json.dumps(out))
"""


def forked_probe(*endpoints: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", FORKED_PROBE, *endpoints], capture_output=True, text=True, timeout=120, check=True
    )
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_the_forked_cri_client_answers_as_the_in_process_one(labs: tuple[Lab, Lab, str, str], tmp_path: Path) -> None:
    lab, decoy, web, nocni = labs
    out = forked_probe(lab.endpoint, decoy.endpoint)
    assert out["same_as_in_process"] and out["first"]["reachable"], out
    assert set(out["first"]["ids"]) == {s.id for s in lab.sandboxes()} >= {web, nocni}
    assert out["told_used"], "a netns path the runtime gave before is taken as given, not asked again"
    assert out["grpc_here"] == [], "the parent never imports grpc or protobuf"
    # Killed, the child answers nothing: the view decides nothing, and the child was reaped.
    assert not out["dead"]["reachable"] and f"pid {out['dead']['pid']}" in out["dead"]["error"]
    assert not out["child_left"]

    unreachable = forked_probe(lab.endpoint, f"unix://{dead_socket(tmp_path / 'dead.sock')}")
    assert unreachable["same_as_in_process"] and not unreachable["first"]["reachable"], unreachable
    assert "dead.sock" in unreachable["first"]["error"]


def test_the_forked_cri_client_ends_with_the_process_that_forked_it(labs: tuple[Lab, Lab, str, str]) -> None:
    """A one-shot killed outright (no close, no cleanup) leaves no CRI client behind."""
    lab = labs[0]
    crash = "import os, sys; from reaper.runtime.forked import ForkedLiveness\n"
    crash += "liveness = ForkedLiveness((sys.argv[1],), 10.0); liveness.observe({})\n"
    crash += "print(liveness.pid, flush=True); os._exit(9)"
    proc = subprocess.run([sys.executable, "-c", crash, lab.endpoint], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    child = int(proc.stdout)
    for _ in range(100):
        if process_state(child) in ("", "Z", "X"):
            break
        time.sleep(0.05)
    assert process_state(child) in ("", "Z", "X"), f"the CRI client {child} outlived its parent"


def process_state(pid: int) -> str:
    """The state letter in /proc/<pid>/stat, "" when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return ""
    return raw[raw.rfind(b")") + 2 :].split()[0].decode()
