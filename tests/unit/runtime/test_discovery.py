"""Finding the runtimes: the kubelet's flag and config file as the kubelet accepts them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from reaper.runtime.cri import CriLiveness
from reaper.runtime.discovery import (
    Endpoint,
    as_url,
    believed_command_lines,
    discover,
    endpoint_in_config,
    flag_value,
    kubelet_endpoints,
)
from tests.harness.fake_cri import FakeRuntime, sandbox, sandbox_list
from tests.harness.fuzz import FUZZ
from tests.harness.procs import believed_process, host_proc


def test_flag_values_in_both_go_spellings_the_last_one_winning() -> None:
    argv = [
        "kubelet",
        "--container-runtime-endpoint",
        "unix:///a.sock",
        "--v=2",
        "--container-runtime-endpoint=/b.sock",
    ]
    assert flag_value(argv, "--container-runtime-endpoint") == "/b.sock"
    assert flag_value(["kubelet", "--container-runtime-endpoint"], "--container-runtime-endpoint") is None
    assert flag_value(["kubelet", "--container-runtime-endpoints=x"], "--container-runtime-endpoint") is None


def test_the_endpoint_in_a_kubelet_configuration() -> None:
    yaml = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/crio/crio.sock\n"
    assert endpoint_in_config(yaml) == "unix:///run/crio/crio.sock"
    assert endpoint_in_config('containerRuntimeEndpoint: "unix:///x.sock"  # the runtime\n') == "unix:///x.sock"
    assert endpoint_in_config('{"kind":"KubeletConfiguration","containerRuntimeEndpoint":"/y.sock"}') == "/y.sock"
    assert endpoint_in_config("  nested:\n    containerRuntimeEndpoint: unix:///z.sock\n") is None  # not top level
    assert endpoint_in_config("kind: KubeletConfiguration\n") is None


def test_only_unix_sockets_are_endpoints() -> None:
    assert as_url("unix:///run/containerd/containerd.sock") == "unix:///run/containerd/containerd.sock"
    assert as_url("/run/crio/crio.sock") == "unix:///run/crio/crio.sock"
    for other in ("tcp://10.0.0.1:1234", "npipe:////./pipe/x", "relative.sock", "unix://relative", ""):
        assert as_url(other) is None


@FUZZ
@given(st.text(max_size=400), st.lists(st.text(max_size=40), max_size=8))
def test_hostile_configs_and_command_lines_never_raise(text: str, argv: list[str]) -> None:
    found = endpoint_in_config(text)
    assert found is None or "\n" not in found
    value = flag_value(argv, "--container-runtime-endpoint")
    url = as_url(value) if value is not None else None
    assert url is None or url.startswith("unix:///")


def _kubelet(proc: Path, pid: int, argv: bytes, root_files: dict[str, bytes | None]) -> None:
    """A fake /proc/<pid> of a process named kubelet; a None file is a FIFO."""
    (proc / str(pid) / "root").mkdir(parents=True)
    (proc / str(pid) / "comm").write_bytes(b"kubelet\n")
    (proc / str(pid) / "cmdline").write_bytes(argv)
    for name, data in root_files.items():
        path = proc / str(pid) / "root" / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            os.mkfifo(path)
        else:
            path.write_bytes(data)


def test_hostile_kubelets_never_hang_or_break_discovery(tmp_path: Path) -> None:
    """Anyone can name a process kubelet: a FIFO for its config, bytes that are not UTF-8, a
    huge command line. Discovery reads each within bounds and takes only unix endpoints."""
    _kubelet(tmp_path, 10, b"kubelet\0--config=/etc/k.yaml\0", {"/etc/k.yaml": None})
    _kubelet(tmp_path, 11, b"kubelet\0--container-runtime-endpoint=\xff\xfe\0", {})
    _kubelet(tmp_path, 12, b"kubelet\0" + b"x" * (1 << 20), {})
    config = b"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/good.sock\n"
    _kubelet(
        tmp_path, 13, b"kubelet\0--config\0/var/lib/kubelet/config.yaml\0", {"/var/lib/kubelet/config.yaml": config}
    )
    _kubelet(tmp_path, 14, b"kubelet\0--container-runtime-endpoint=tcp://10.0.0.1:1\0", {})
    found = kubelet_endpoints(str(tmp_path))
    assert [(e.url, e.source) for e in found] == [
        ("unix:///run/good.sock", "kubelet (pid 13) config /var/lib/kubelet/config.yaml")
    ]
    # This /proc has no pid 1 to compare with: no process named kubelet is believed.
    assert found[0].refused is not None and "pid 1" in found[0].refused


def _believed_kubelet(proc: Path, pid: int, host_root: Path, endpoint: str) -> None:
    believed_process(proc, pid, host_root, ["kubelet", f"--container-runtime-endpoint={endpoint}"])


def test_a_kubelets_endpoint_is_the_socket_in_the_hosts_root(tmp_path: Path) -> None:
    """Resolved with pid 1's root as "/", its absolute symlinks included (/var/run -> /run)."""
    host = tmp_path / "host"
    (host / "run").mkdir(parents=True)
    (host / "var").mkdir()
    (host / "var" / "run").symlink_to("/run")
    host_proc(tmp_path / "proc", host)
    _believed_kubelet(tmp_path / "proc", 4242, host, "unix:///var/run/k.sock")
    with FakeRuntime(host / "run" / "k.sock", sandbox_list([sandbox("k1")]), {"k1": "/run/netns/k1"}):
        found = discover(str(tmp_path / "proc"), known=())
        view = CriLiveness((), 5.0, find=lambda: found).observe({})
    assert [(e.url, e.source, e.refused) for e in found] == [
        ("unix:///var/run/k.sock", "kubelet (pid 4242) --container-runtime-endpoint", None)
    ]
    assert view.reachable and [s.id for s in view.sandboxes] == ["k1"], view.error


def test_a_socket_swapped_after_the_check_is_never_asked_and_the_known_one_stays(tmp_path: Path) -> None:
    """The kubelet's endpoint is the known socket (a hard link: the same inode), and right after
    discovery both paths are swapped for a runtime that lists nothing. The known socket stays
    the one asked, through the fd that was checked, and its NotReady sandbox keeps its pin."""
    host = tmp_path / "host"
    (host / "run").mkdir(parents=True)
    known, evil = tmp_path / "known.sock", tmp_path / "evil.sock"
    host_proc(tmp_path / "proc", host)
    _believed_kubelet(tmp_path / "proc", 4242, host, "unix:///run/k.sock")
    listed = sandbox_list([sandbox("pinned", ready=False)])
    with FakeRuntime(known, listed, {"pinned": "/run/netns/cni-pinned"}) as real, FakeRuntime(evil, b"", {}) as fake:
        os.link(known, host / "run" / "k.sock")

        def find_then_swap() -> list[Endpoint]:
            found = discover(str(tmp_path / "proc"), known=(("containerd", str(known)),))
            os.link(evil, tmp_path / "evil-2.sock")
            os.rename(evil, known)
            os.rename(tmp_path / "evil-2.sock", host / "run" / "k.sock")
            return found

        view = CriLiveness((), 5.0, find=find_then_swap).observe({})
        assert fake.calls == {"Version": 0, "ListPodSandbox": 0, "PodSandboxStatus": 0}
        assert real.calls["ListPodSandbox"] == 1
    assert view.reachable, view.error
    assert [(a.endpoint, a.source) for a in view.runtimes] == [(f"unix://{known}", "known socket (containerd)")]
    (pinned,) = view.sandboxes
    assert pinned.id == "pinned" and not pinned.ready and pinned.netns_path == "/run/netns/cni-pinned"


def test_every_socket_discovery_opens_is_closed_when_the_runtimes_have_answered(tmp_path: Path) -> None:
    """The agent discovers on every pass: the fds of the sockets it checked go with the pass."""
    host = tmp_path / "host"
    (host / "run").mkdir(parents=True)
    host_proc(tmp_path / "proc", host)
    _believed_kubelet(tmp_path / "proc", 4242, host, "unix:///run/k.sock")
    with FakeRuntime(host / "run" / "k.sock", b"", {}), FakeRuntime(tmp_path / "known.sock", b"", {}):
        known = (("containerd", str(tmp_path / "known.sock")),)
        liveness = CriLiveness((), 5.0, find=lambda: discover(str(tmp_path / "proc"), known=known))
        views = [liveness.observe({}) for _ in range(3)]
        held = set(_open_files())
    assert all(v.reachable and len(v.runtimes) == 2 for v in views)
    assert not held & {str(host / "run" / "k.sock"), str(tmp_path / "known.sock")}


def _open_files() -> Iterator[str]:
    """What each of this process's fds names."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, closed since
            yield os.readlink(f"/proc/self/fd/{fd}")


def test_the_kubelets_config_dir_drop_ins_win_over_its_config_in_lexical_order(tmp_path: Path) -> None:
    """kubelet --config-dir: files ending .conf, merged in lexical order over --config."""
    host = tmp_path / "host"
    (host / "etc" / "kubelet.d").mkdir(parents=True)
    (host / "etc" / "kubelet.yaml").write_text("containerRuntimeEndpoint: unix:///run/base.sock\n")
    (host / "etc" / "kubelet.d" / "10-a.conf").write_text("containerRuntimeEndpoint: unix:///run/ten.sock\n")
    (host / "etc" / "kubelet.d" / "20-b.conf").write_text("containerRuntimeEndpoint: unix:///run/twenty.sock\n")
    (host / "etc" / "kubelet.d" / "30-c.conf").write_text("maxPods: 10\n")  # says nothing of the endpoint
    (host / "etc" / "kubelet.d" / "90-z.yaml").write_text("containerRuntimeEndpoint: unix:///run/no.sock\n")
    # Neither a FIFO (with a writer that has an endpoint waiting in it) nor a device under a
    # drop-in's name is read.
    fifo = host / "etc" / "kubelet.d" / "60-fifo.conf"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    os.write(writer, b"containerRuntimeEndpoint: unix:///run/fifo.sock\n")
    (host / "etc" / "kubelet.d" / "50-dev.conf").symlink_to("/dev/zero")
    proc = tmp_path / "proc"
    host_proc(proc, host)
    believed_process(proc, 7, host, ["kubelet", "--config=/etc/kubelet.yaml", "--config-dir", "/etc/kubelet.d"])
    believed_process(proc, 8, host, ["kubelet", "--config=/etc/kubelet.yaml"])
    found = sorted((e.url, e.source) for e in kubelet_endpoints(str(proc)))
    assert found == [
        ("unix:///run/base.sock", "kubelet (pid 8) config /etc/kubelet.yaml"),
        ("unix:///run/twenty.sock", "kubelet (pid 7) config dir /etc/kubelet.d"),
    ]
    os.close(writer)


def test_only_processes_the_hosts_init_could_have_started_give_their_command_lines(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    proc = tmp_path / "proc"
    host_proc(proc, host)
    believed_process(proc, 30, host, ["crio", "--cni-config-dir=/etc/a"])
    believed_process(proc, 20, host, ["crio", "--cni-config-dir=/etc/b"], uid=1000)
    believed_process(proc, 10, host, ["containerd"])
    assert believed_command_lines(str(proc), b"crio") == [(30, ["crio", "--cni-config-dir=/etc/a"])]
    assert believed_command_lines(str(proc / "none"), b"crio") == []
