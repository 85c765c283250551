"""The netns path in PodSandboxStatus info, as containerd and CRI-O lay it out."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from reaper.runtime.cri import netns_path_from_info
from tests.harness.fuzz import FUZZ, json_values


def test_cri_info_layouts() -> None:
    containerd = {"info": json.dumps({"sandboxMetadata": {"Metadata": {}, "NetNSPath": "/var/run/netns/cni-a"}})}
    assert netns_path_from_info(containerd) == "/var/run/netns/cni-a"
    containerd16 = {"info": json.dumps({"sandboxMetadata": {"Metadata": {"NetNSPath": "/run/netns/cni-b"}}})}
    assert netns_path_from_info(containerd16) == "/run/netns/cni-b"
    crio = {
        "info": json.dumps(
            {
                "runtimeSpec": {
                    "linux": {"namespaces": [{"type": "pid"}, {"type": "network", "path": "/var/run/netns/u"}]}
                }
            }
        )
    }
    assert netns_path_from_info(crio) == "/var/run/netns/u"
    for broken in (
        {},
        {"info": "{"},
        {"info": "[]"},
        {"info": json.dumps({"runtimeSpec": {"linux": {"namespaces": 3}}})},
    ):
        assert netns_path_from_info(broken) is None


@FUZZ
@given(st.dictionaries(st.text(max_size=8), st.text(max_size=50) | json_values.map(json.dumps), max_size=4))
def test_cri_info_parser_takes_any_map(info: dict[str, str]) -> None:
    path = netns_path_from_info(info)
    assert path is None or isinstance(path, str)
