"""Finding the runtimes: the kubelet's flag and config file as the kubelet accepts them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reaper.runtime.discovery import as_url, endpoint_in_config, flag_value
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
