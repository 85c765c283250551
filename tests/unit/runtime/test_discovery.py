"""Finding the runtimes: the kubelet's flag and config file as the kubelet accepts them."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from reaper.runtime.discovery import as_url, endpoint_in_config, flag_value, kubelet_endpoints
from tests.harness.fuzz import FUZZ


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
