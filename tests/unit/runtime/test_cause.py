"""The line a pass that no runtime answered ends with: the likely cause, not the socket list
again; and a --runtime-endpoint with no socket behind it said plainly, not in gRPC's words."""

from __future__ import annotations

import socket
from pathlib import Path

from reaper.doctor import _runtimes
from reaper.layout import Layout, RuntimeLayout
from reaper.model import RuntimeAnswer, RuntimeView
from reaper.runtime.cause import likely_cause
from reaper.runtime.cri import CriLiveness
from reaper.runtime.discovery import NAME_THEM, REFUSED, Endpoint

CONTAINERD = RuntimeLayout(
    runtime="containerd",
    conf_dir="/etc/cni/net.d",
    bin_dirs=("/opt/cni/bin",),
    netns_dir="/var/run/netns",
    sources=("/etc/containerd/config.toml",),
    socket="/run/containerd/containerd.sock",
    serving=False,
)


def view(*answers: RuntimeAnswer, error: str = "no CRI socket found (tried ...)") -> RuntimeView:
    return RuntimeView(
        endpoint="", name=None, version=None, reachable=False, error=error, sandboxes=(), runtimes=answers
    )


def answer(url: str, error: str, *, skipped: bool) -> RuntimeAnswer:
    return RuntimeAnswer(
        endpoint=url, source="known socket", name=None, version=None, reachable=False, error=error, sandboxes=0,
        skipped=skipped,
    )  # fmt: skip


def test_a_runtime_configured_here_with_no_socket_is_the_cause() -> None:
    cause = likely_cause(view(), Layout(runtimes=(CONTAINERD,)))
    assert cause == (
        "containerd's config is here (/etc/containerd/config.toml) but nothing listens on its socket "
        "/run/containerd/containerd.sock: is containerd running?"
    )
    assert "tried" not in cause  # the list is the report's, said once


def test_a_configured_runtimes_socket_nobody_listens_on_is_the_cause() -> None:
    refused = answer("unix:///run/containerd/containerd.sock", f"{REFUSED}; {NAME_THEM}", skipped=False)
    cause = likely_cause(view(refused), Layout(runtimes=(CONTAINERD,)))
    assert cause.startswith("containerd's config is here") and "is containerd running?" in cause
    assert cause.endswith(NAME_THEM)  # a crashed runtime is waited for, unless the operator names the others


def test_a_dead_socket_of_no_configured_runtime() -> None:
    refused = answer("unix:///run/cri-dockerd.sock", f"{REFUSED}; {NAME_THEM}", skipped=False)
    assert likely_cause(view(refused), Layout()) == (
        f"nothing listens on /run/cri-dockerd.sock: has the runtime that made it crashed?; {NAME_THEM}"
    )


def test_no_runtime_at_all() -> None:
    assert likely_cause(view(), Layout()).startswith("no CRI runtime here: none of the known sockets")


def test_a_runtime_that_was_asked_and_failed_says_its_own_error() -> None:
    failed = answer("unix:///run/crio/crio.sock", "Version on ...: DEADLINE_EXCEEDED", skipped=False)
    assert likely_cause(view(failed, error="Version on ...: DEADLINE_EXCEEDED"), Layout(runtimes=(CONTAINERD,))) == (
        "Version on ...: DEADLINE_EXCEEDED"
    )


def test_an_endpoint_given_with_no_socket_behind_it_says_so(tmp_path: Path) -> None:
    missing = f"unix://{tmp_path}/none.sock"
    seen = CriLiveness((missing,), 2.0).observe({})
    assert not seen.reachable and seen.error == f"no socket at {tmp_path}/none.sock"
    (only,) = seen.runtimes
    assert only.error == f"no socket at {tmp_path}/none.sock" and not only.skipped


def test_an_endpoint_given_that_is_no_socket_says_so(tmp_path: Path) -> None:
    (tmp_path / "file.sock").write_text("")
    seen = CriLiveness((f"unix://{tmp_path}/file.sock",), 2.0).observe({})
    assert seen.error == f"{tmp_path}/file.sock is not a socket"


def test_an_endpoint_given_whose_socket_nobody_serves_is_still_asked(tmp_path: Path) -> None:
    # A socket file that is there: gRPC's connect is what fails, and says how.
    path = tmp_path / "dead.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    seen = CriLiveness((f"unix://{path}",), 2.0).observe({})
    assert not seen.reachable and seen.error is not None and "no socket at" not in seen.error


def test_a_discovered_socket_nobody_listens_on_is_a_runtime_that_could_not_be_asked(tmp_path: Path) -> None:
    # A runtime that crashed leaves its socket file: never skipped (issue 31 case 5).
    path = tmp_path / "dead.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    seen = CriLiveness((), 2.0, find=lambda: [Endpoint(f"unix://{path}", "known socket (containerd)")]).observe({})
    (only,) = seen.runtimes
    assert not only.skipped and not seen.reachable and only.error == f"{REFUSED}; {NAME_THEM}"


def test_doctor_gives_the_likely_cause_as_its_fix_not_a_flag_to_pass() -> None:
    checks = list(_runtimes(view(), Layout(runtimes=(CONTAINERD,))))
    failed = [c for c in checks if c.status == "fail"]
    assert failed and failed[-1].fix is not None and failed[-1].fix.endswith("is containerd running?")
    assert not any("--runtime-endpoint" in (c.fix or "") for c in failed)


def test_doctor_says_a_crashed_runtime_is_waited_for_unless_the_others_are_named() -> None:
    refused = answer("unix:///run/containerd/containerd.sock", f"{REFUSED}; {NAME_THEM}", skipped=False)
    checks = list(_runtimes(view(refused), Layout(runtimes=(CONTAINERD,))))
    failed = [c for c in checks if c.status == "fail"]
    assert failed[0].message.startswith("unix:///run/containerd/containerd.sock (known socket): could not be asked")
    assert failed[0].fix is not None and failed[0].fix.startswith(
        "start it again; if it is gone for good, pass --runtime-endpoint"
    )
    assert (
        failed[-1].fix is not None
        and "is containerd running?" in failed[-1].fix
        and "--runtime-endpoint" in failed[-1].fix
    )
