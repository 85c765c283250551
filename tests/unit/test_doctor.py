"""`reaper doctor`'s checks that are pure: the chart's preset against the node's configs."""

from __future__ import annotations

import json

import pytest

from reaper.doctor import _preset
from reaper.kinds.netconf import parse_network_config
from reaper.model import NetworkConfig


def _config(*types: str) -> NetworkConfig:
    doc = {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": t} for t in types]}
    return parse_network_config(json.dumps(doc).encode(), "/etc/cni/net.d/10-net.conflist")


@pytest.mark.parametrize(
    ("preset", "types", "status", "says"),
    [
        ("calico", ("calico", "portmap"), "ok", "matches"),
        ("cilium", ("calico", "portmap"), "warn", "use calico"),
        ("none", ("flannel", "portmap"), "warn", "cniPreset=flannel"),
        ("flannel", ("bridge",), "warn", "none of the presets"),
        ("weave", ("bridge",), "warn", "unknown cniPreset"),
    ],
)
def test_a_preset_that_does_not_match_the_node_is_reported(
    preset: str, types: tuple[str, ...], status: str, says: str
) -> None:
    (check,) = list(_preset(preset, [_config(*types)]))
    assert check.status == status and says in check.message + check.fix


def test_no_preset_and_none_on_a_plain_node_say_nothing() -> None:
    assert list(_preset(None, [_config("bridge")])) == []
    assert list(_preset("none", [_config("bridge", "portmap")])) == []
