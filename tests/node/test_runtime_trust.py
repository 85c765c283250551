"""Only the node's kubelet picks a CRI runtime: real processes named kubelet, each in one way
not what the host's init (pid 1) would start as its kubelet, point at a socket that is no CRI
runtime. Their endpoints are reported and never asked, and the pass stays decided.

The /proc discovery reads is this machine's, seen through a directory of links: its "1" is
this test's own process (the host's init here may not be inspectable), every other entry the
real /proc entry of a process the test started."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.runtime.cri import CriLiveness
from reaper.runtime.discovery import Endpoint, close_all, discover
from tests.harness.fake_cri import FakeRuntime, NotCri, sandbox, sandbox_list
from tests.harness.probe import probe_argv
from tests.harness.probes import fake_kubelet

PYTHON = "/usr/bin/python3.11"  # a standalone interpreter any user may run, owned by root
NOBODY = "65534"
pytestmark = pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"needs {PYTHON}")


def start_kubelet(prefix: list[str], endpoint: str, *, exe: str = PYTHON, chroot: str = "") -> subprocess.Popen[bytes]:
    flag = f"--container-runtime-endpoint={endpoint}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONHOME": "/usr"}
    argv = [*prefix, *probe_argv(fake_kubelet, "say-ready", chroot, flag, python=exe)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.read(1) == b"k", "the fake kubelet did not start"
    return proc


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Path, dict[str, subprocess.Popen[bytes]], NotCri, FakeRuntime]]:
    """The links /proc, the kubelets, the socket that is no runtime, and the real kubelet's runtime."""
    not_cri = NotCri(tmp_path / "not-cri.sock")
    not_cri.start()
    runtime = FakeRuntime(tmp_path / "cri.sock", sandbox_list([sandbox("web")]), {"web": "/run/netns/cni-web"})
    (tmp_path / "jail").mkdir()
    own_exe = tmp_path / "owned-by-nobody" / "kubelet"
    writable_exe = tmp_path / "group-writable" / "kubelet"
    for exe in (own_exe, writable_exe):
        exe.parent.mkdir()
        shutil.copy2(PYTHON, exe)
    os.chown(own_exe, int(NOBODY), int(NOBODY))
    os.chmod(writable_exe, 0o775)
    bad = f"unix://{tmp_path / 'not-cri.sock'}"
    kubelets: dict[str, subprocess.Popen[bytes]] = {}
    try:
        kubelets["believed"] = start_kubelet([], runtime.endpoint)
        kubelets["mount namespace"] = start_kubelet(["unshare", "--mount", "--propagation", "private"], bad)
        kubelets["root"] = start_kubelet([], bad, chroot=str(tmp_path / "jail"))
        kubelets["exe owner"] = start_kubelet([], bad, exe=str(own_exe))
        kubelets["exe mode"] = start_kubelet([], bad, exe=str(writable_exe))
        kubelets["user"] = start_kubelet(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"], bad)
        proc = tmp_path / "proc"
        proc.mkdir()
        (proc / "1").symlink_to(f"/proc/{os.getpid()}")
        for kubelet in kubelets.values():
            (proc / str(kubelet.pid)).symlink_to(f"/proc/{kubelet.pid}")
        yield proc, kubelets, not_cri, runtime
    finally:
        for kubelet in kubelets.values():
            kubelet.kill()
            kubelet.wait()
        not_cri.listener.close()
        runtime.close()


def test_only_a_kubelet_pid_1_could_have_started_picks_a_runtime(
    node: tuple[Path, dict[str, subprocess.Popen[bytes]], NotCri, FakeRuntime],
) -> None:
    proc, kubelets, _, runtime = node
    found = discover(str(proc), known=())
    try:
        by_pid = {int(e.source.split()[2].rstrip(")")): e for e in found}
        believed = by_pid[kubelets["believed"].pid]
        assert believed.url == runtime.endpoint and believed.refused is None and believed.fd is not None
        why = {name: by_pid[k.pid].refused for name, k in kubelets.items() if name != "believed"}
        assert all(by_pid[k.pid].fd is None for name, k in kubelets.items() if name != "believed")
    finally:
        close_all(found)
    assert why == {
        "mount namespace": "not asked: it runs in another mount namespace than the host's (pid 1)",
        "root": "not asked: its root directory is not the host's (pid 1)",
        "exe owner": (
            f"not asked: its executable is not a file owned by root that only root may write (uid {NOBODY}, mode 755)"
        ),
        "exe mode": "not asked: its executable is not a file owned by root that only root may write (uid 0, mode 775)",
        "user": "not asked: it does not run as root",
    }


def test_an_endpoint_no_believed_kubelet_names_is_reported_and_the_pass_stays_decided(
    node: tuple[Path, dict[str, subprocess.Popen[bytes]], NotCri, FakeRuntime],
) -> None:
    proc, kubelets, not_cri, runtime = node

    def find() -> list[Endpoint]:
        return discover(str(proc), known=())

    view = CriLiveness((), 5.0, find=find).observe({})
    assert view.reachable and [s.id for s in view.sandboxes] == ["web"], view.error
    asked = [a for a in view.runtimes if not a.skipped]
    assert [(a.endpoint, a.reachable) for a in asked] == [(runtime.endpoint, True)]
    reported = [a for a in view.runtimes if a.skipped]
    assert len(reported) == len(kubelets) - 1
    assert all(a.error is not None and a.error.startswith("not asked: ") for a in reported)
    assert not_cri.accepted == 0 and runtime.calls["ListPodSandbox"] == 1
