"""Every runtime on the node is asked, or the pass waits (issue 31, cases 4 and 5): a known
socket path reached through symlinks is followed while every link and directory on the way is
root's alone, and a path that exists and leads to no such socket, or a socket nobody listens on
(a runtime that crashed), is a runtime that could not be asked, named with why, never "no
socket". Each runtime is a real grpc server (tests/harness/fake_cri.py); a decoy that answers
and lists nothing sits at another known path, as Docker's containerd with CRI on or a leftover
k3s does on a real node."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.host.resolve import MAX_LINKS
from reaper.model import RuntimeView
from reaper.runtime import discovery
from reaper.runtime.cri import CriLiveness
from reaper.runtime.discovery import discover, kubelet_endpoints
from tests.harness.fake_cri import FakeRuntime, decoy_runtime, sandbox, sandbox_list
from tests.harness.procs import believed_process, host_proc

PINNED = sandbox_list([sandbox("pinned", ready=False)])  # a NOTREADY sandbox: its pin is its own


@pytest.fixture
def decoy(tmp_path: Path) -> Iterator[Path]:
    """A runtime that answers and lists nothing, at a known path of its own."""
    with decoy_runtime(tmp_path) as path:
        yield path


def observe(proc: Path, *known: tuple[str, Path]) -> RuntimeView:
    paths = tuple((name, str(path)) for name, path in known)
    return CriLiveness((), 5.0, find=lambda: discover(str(proc), known=paths)).observe({})


def dead_socket(path: Path) -> Path:
    """A socket file nobody listens on: what a runtime that crashed leaves."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    return path


def test_the_nodes_runtime_through_a_symlink_at_a_known_path_is_asked(tmp_path: Path, decoy: Path) -> None:
    """Case 4: the node's runtime reached through a symlink at CRI-O's known path (k3s users
    link /run/containerd/containerd.sock to k3s' own). Its NOTREADY sandbox stays listed: its
    pin, veth and lease are never an orphan's."""
    real = tmp_path / "k3s" / "containerd" / "containerd.sock"
    real.parent.mkdir(parents=True)
    (tmp_path / "crio").mkdir()
    (tmp_path / "crio" / "crio.sock").symlink_to(real)
    with FakeRuntime(real, PINNED, {"pinned": "/run/netns/cni-pinned"}) as runtime:
        view = observe(tmp_path / "proc", ("containerd", decoy), ("cri-o", tmp_path / "crio" / "crio.sock"))
        assert runtime.calls["ListPodSandbox"] == 1
    assert view.reachable, view.error
    assert [s.id for s in view.sandboxes] == ["pinned"]
    assert [a.endpoint for a in view.runtimes] == [f"unix://{decoy}", f"unix://{tmp_path}/crio/crio.sock"]
    # Each sandbox under the runtime that listed it (what reaper.runtime.listed remembers).
    assert [s.runtime for s in view.sandboxes] == [f"unix://{tmp_path}/crio/crio.sock"]


def test_two_known_paths_reaching_one_socket_ask_it_once(tmp_path: Path) -> None:
    """/var/run links to /run, and a k3s node links containerd's path to its own: one socket,
    one runtime, asked once; the first known path names it."""
    (tmp_path / "run" / "k3s").mkdir(parents=True)
    (tmp_path / "run" / "containerd").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("../run")
    real = tmp_path / "run" / "k3s" / "containerd.sock"
    (tmp_path / "run" / "containerd" / "containerd.sock").symlink_to(real)
    spellings = [
        ("containerd", tmp_path / "run" / "containerd" / "containerd.sock"),
        ("containerd", tmp_path / "var" / "run" / "containerd" / "containerd.sock"),
        ("k3s/rke2", real),
        ("k3s/rke2", tmp_path / "var" / "run" / "k3s" / "containerd.sock"),
    ]
    with FakeRuntime(real, PINNED, {"pinned": "/run/netns/cni-pinned"}) as runtime:
        view = observe(tmp_path / "proc", *spellings)
        assert runtime.calls["ListPodSandbox"] == 1
    assert view.reachable, view.error
    assert [a.endpoint for a in view.runtimes] == [f"unix://{spellings[0][1]}"]


def test_as_many_links_as_the_kernel_follows_are_followed(tmp_path: Path, decoy: Path) -> None:
    """MAX_LINKS links in a row is what the kernel itself follows (MAXSYMLINKS): still asked."""
    (tmp_path / "crio").mkdir()
    at = tmp_path / "crio" / "crio.sock"
    hops = [tmp_path / "crio" / f"hop-{i}" for i in range(MAX_LINKS)]
    for here, there in zip([at, *hops[:-1]], hops, strict=True):
        here.symlink_to(there)
    with FakeRuntime(hops[-1], PINNED, {"pinned": "/run/netns/cni-pinned"}):
        view = observe(tmp_path / "proc", ("containerd", decoy), ("cri-o", at))
    assert view.reachable and [s.id for s in view.sandboxes] == ["pinned"], view.error


def _loop(at: Path) -> None:
    (at.parent / "other.sock").symlink_to(at)
    at.symlink_to(at.parent / "other.sock")


def _chain(at: Path) -> None:
    """MAX_LINKS + 1 links in a row, the last one to a socket."""
    hops = [at.parent / f"hop-{i}" for i in range(MAX_LINKS + 1)]
    for here, there in zip([at, *hops[:-1]], hops, strict=True):
        here.symlink_to(there)
    dead_socket(hops[-1])


def _dangling(at: Path) -> None:
    at.symlink_to(at.parent / "gone" / "crio.sock")


def _regular_file(at: Path) -> None:
    at.write_text("")


def _directory(at: Path) -> None:
    at.mkdir()


def _link_to_a_fifo(at: Path) -> None:
    os.mkfifo(at.parent / "fifo")
    at.symlink_to(at.parent / "fifo")


def _link_into_proc(at: Path) -> None:
    at.symlink_to("/proc/self/cwd/crio.sock")


UNASKABLE = {
    "a symlink loop": (_loop, "more than 40 symlinks"),
    "a chain of more than 40 links": (_chain, "more than 40 symlinks"),
    "a dangling symlink": (_dangling, "does not exist (a dangling symlink)"),
    "a regular file": (_regular_file, "leads to a regular file, not a socket"),
    "a directory": (_directory, "leads to a directory, not a socket"),
    "a symlink to a FIFO": (_link_to_a_fifo, "leads to a FIFO, not a socket"),
    "a symlink through /proc": (_link_into_proc, "is a link in /proc, never followed"),
}


@pytest.mark.parametrize("case", sorted(UNASKABLE))
def test_a_known_path_that_exists_and_leads_to_no_socket_makes_the_pass_wait(
    case: str, tmp_path: Path, decoy: Path
) -> None:
    """Never "no socket" for a path that exists: the pass is undecided, naming the path and why,
    and the operator is told what to do when that runtime is gone for good."""
    make, why = UNASKABLE[case]
    (tmp_path / "crio").mkdir()
    at = tmp_path / "crio" / "crio.sock"
    make(at)
    view = observe(tmp_path / "proc", ("containerd", decoy), ("cri-o", at))
    assert not view.reachable and view.sandboxes == ()
    assert view.error is not None and view.error.startswith(f"unix://{at}: could not be asked: ")
    assert why in view.error and "--runtime-endpoint" in view.error and "\n" not in view.error
    (unasked,) = [a for a in view.runtimes if not a.reachable]
    assert unasked.endpoint == f"unix://{at}" and not unasked.skipped


def test_a_known_path_that_does_not_exist_is_no_runtime(tmp_path: Path, decoy: Path) -> None:
    """A missing component before the last (no /run/crio at all, a directory link whose target
    is gone) is a runtime that is not installed: the pass stays decided on the others."""
    (tmp_path / "crio-link").symlink_to(tmp_path / "gone")
    view = observe(
        tmp_path / "proc",
        ("containerd", decoy),
        ("cri-o", tmp_path / "crio" / "crio.sock"),
        ("cri-o", tmp_path / "crio-link" / "crio.sock"),
    )
    assert view.reachable and [a.endpoint for a in view.runtimes] == [f"unix://{decoy}"], view.error


def test_a_dangling_link_under_both_spellings_of_run_is_named_once(tmp_path: Path, decoy: Path) -> None:
    (tmp_path / "run" / "crio").mkdir(parents=True)
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to(tmp_path / "run")
    (tmp_path / "run" / "crio" / "crio.sock").symlink_to("/nonexistent/crio.sock")
    view = observe(
        tmp_path / "proc",
        ("containerd", decoy),
        ("cri-o", tmp_path / "run" / "crio" / "crio.sock"),
        ("cri-o", tmp_path / "var" / "run" / "crio" / "crio.sock"),
    )
    assert not view.reachable
    assert [a.endpoint for a in view.runtimes if not a.reachable] == [f"unix://{tmp_path}/run/crio/crio.sock"]


def test_a_crashed_runtimes_socket_makes_the_pass_wait(tmp_path: Path, decoy: Path) -> None:
    """Case 5: the node's containerd killed, its socket file left, connections refused, while
    another runtime answers and lists nothing. The crashed runtime's NOTREADY sandboxes are
    still its own: the pass is undecided, and the line says what the operator can do."""
    (tmp_path / "containerd").mkdir()
    dead = dead_socket(tmp_path / "containerd" / "containerd.sock")
    view = observe(tmp_path / "proc", ("containerd", dead), ("k3s/rke2", decoy))
    assert not view.reachable and view.sandboxes == ()
    assert view.error is not None and view.error.startswith(f"unix://{dead}: could not be asked: ")
    assert "connection refused" in view.error and "--runtime-endpoint" in view.error
    (crashed,) = [a for a in view.runtimes if not a.reachable]
    assert crashed.endpoint == f"unix://{dead}" and not crashed.skipped


def test_a_crashed_runtime_named_away_by_the_operator_is_not_asked(tmp_path: Path, decoy: Path) -> None:
    """The operator who knows the runtime is gone names the ones that serve pods."""
    dead_socket(tmp_path / "dead.sock")
    view = CriLiveness((f"unix://{decoy}",), 5.0).observe({})
    assert view.reachable and [a.endpoint for a in view.runtimes] == [f"unix://{decoy}"], view.error


def test_the_kubelets_config_is_read_in_its_own_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point 10: the kubelet's --config is a symlink to an absolute path. Read through
    /proc/<pid>/root by path, the link would resolve in the reaper's root, where a file of the
    same name says another endpoint; it is resolved in the kubelet's own root (openat2
    RESOLVE_IN_ROOT, and the walk where openat2 is not offered). The same for --config-dir."""
    host = tmp_path / "host"
    elsewhere = tmp_path / "elsewhere"  # an absolute path that exists in both roots
    (elsewhere / "kubelet.d").mkdir(parents=True)
    (elsewhere / "config.yaml").write_text("containerRuntimeEndpoint: unix:///run/wrong.sock\n")
    (elsewhere / "kubelet.d" / "10.conf").write_text("containerRuntimeEndpoint: unix:///run/wrong-drop-in.sock\n")
    inside = host / str(elsewhere).lstrip("/")
    (inside / "kubelet.d").mkdir(parents=True)
    (inside / "config.yaml").write_text("containerRuntimeEndpoint: unix:///run/right.sock\n")
    (inside / "kubelet.d" / "10.conf").write_text("containerRuntimeEndpoint: unix:///run/right-drop-in.sock\n")
    (host / "etc").mkdir()
    (host / "etc" / "kubelet.yaml").symlink_to(elsewhere / "config.yaml")
    (host / "etc" / "kubelet.d").symlink_to(elsewhere / "kubelet.d")
    proc = tmp_path / "proc"
    host_proc(proc, host)
    believed_process(proc, 7, host, ["kubelet", "--config=/etc/kubelet.yaml"])
    believed_process(proc, 8, host, ["kubelet", "--config=/etc/kubelet.yaml", "--config-dir=/etc/kubelet.d"])
    expected = sorted(["unix:///run/right.sock", "unix:///run/right-drop-in.sock"])
    assert sorted(e.url for e in kubelet_endpoints(str(proc))) == expected
    monkeypatch.setattr(discovery, "openat2", lambda *_: None)  # a kernel before 5.6
    assert sorted(e.url for e in kubelet_endpoints(str(proc))) == expected


def test_a_kubelets_endpoint_through_a_symlink_in_its_root_is_asked(tmp_path: Path, decoy: Path) -> None:
    """The kubelet's endpoint is an absolute symlink, resolved in the kubelet's root."""
    host = tmp_path / "host"
    (host / "run" / "k3s").mkdir(parents=True)
    (host / "run" / "kubelet-runtime.sock").symlink_to("/run/k3s/containerd.sock")
    proc = tmp_path / "proc"
    host_proc(proc, host)
    believed_process(proc, 4242, host, ["kubelet", "--container-runtime-endpoint=unix:///run/kubelet-runtime.sock"])
    with FakeRuntime(host / "run" / "k3s" / "containerd.sock", PINNED, {"pinned": "/run/netns/cni-pinned"}):
        view = observe(proc, ("containerd", decoy))
    assert view.reachable and [s.id for s in view.sandboxes] == ["pinned"], view.error


@pytest.mark.parametrize("case", ["a regular file", "a dangling symlink", "no file at all", "a way out of its root"])
def test_a_kubelets_endpoint_that_cannot_be_opened_makes_the_pass_wait(case: str, tmp_path: Path, decoy: Path) -> None:
    """The believed kubelet's runtime is the node's: its endpoint with no socket of root's
    behind it is a runtime that could not be asked. A relative link climbing out of the
    kubelet's root stays in it (as RESOLVE_IN_ROOT does) and finds nothing there."""
    host = tmp_path / "host"
    (host / "run").mkdir(parents=True)
    endpoint = host / "run" / "kubelet-runtime.sock"
    outside = tmp_path / "outside.sock"
    if case == "a regular file":
        endpoint.write_text("")
    elif case == "a dangling symlink":
        endpoint.symlink_to("/run/gone.sock")
    elif case == "a way out of its root":
        endpoint.symlink_to("../" * 20 + str(outside).lstrip("/"))
    proc = tmp_path / "proc"
    host_proc(proc, host)
    believed_process(proc, 4242, host, ["kubelet", "--container-runtime-endpoint=unix:///run/kubelet-runtime.sock"])
    with FakeRuntime(outside, PINNED, {}) as escaped:
        view = observe(proc, ("containerd", decoy))
        assert escaped.calls["ListPodSandbox"] == 0
    assert not view.reachable
    assert view.error is not None and view.error.startswith("unix:///run/kubelet-runtime.sock: could not be asked: ")
    assert "--runtime-endpoint" in view.error
