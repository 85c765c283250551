"""Network configs: lists and single plugins, broken ones, and any bytes at all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.kinds.netconf import (
    MAX_CONFIG_BYTES,
    ConfigError,
    collect_configs,
    collect_configs_of,
    parse_network_config,
    plugin_list,
    stateful_plugins,
)
from reaper.names import is_cni_id
from tests.harness.configs import conflist
from tests.harness.fuzz import FUZZ, json_values


def test_network_config_list_and_single() -> None:
    cfg = parse_network_config(conflist(dataDir="/run/ipam"), "/x.conflist")
    assert cfg.name == "mynet" and cfg.plugin_types == ("bridge", "portmap")
    assert cfg.ipam_data_dirs == ("/run/ipam",)
    assert cfg.ipam_ranges[0].start == "10.88.0.1" and cfg.ipam_ranges[0].end == "10.88.0.254"
    single = parse_network_config(
        json.dumps(
            {
                "cniVersion": "0.4.0",
                "name": "n1",
                "type": "bridge",
                "ipam": {"type": "host-local", "subnet": "fd00::/120"},
            }
        ).encode(),
        "/y.conf",
    )
    assert single.plugin_types == ("bridge",)
    assert single.ipam_ranges[0].end == "fd00::ff"
    # A config in a log line or a failed assertion shows what was read of it, not the whole file
    # (a config can hold credentials a plugin takes, and be megabytes long).
    assert repr(cfg).startswith("NetworkConfig(name='mynet', path='/x.conflist'") and "raw=" not in repr(cfg)
    assert "10.88.0.1" in repr(cfg) and b"cniVersion" in cfg.raw


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[]", b'{"name": "x"}', b'{"name": "../x", "type": "bridge"}', b'{"name": "x", "plugins": [{}]}'],
)
def test_broken_network_configs(raw: bytes) -> None:
    with pytest.raises(ConfigError):
        parse_network_config(raw, "/z.conf")


@FUZZ
@given(st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()))
def test_network_config_parser_takes_any_bytes(data: bytes) -> None:
    try:
        config = parse_network_config(data, "/x.conflist")
    except ConfigError:
        return
    assert is_cni_id(config.name)


@FUZZ
@given(json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=200))
def test_del_config_parser_takes_any_bytes(data: bytes) -> None:
    try:
        name, _, plugins = plugin_list(data)
    except ConfigError:
        return
    assert is_cni_id(name) and all(isinstance(p["type"], str) for p in plugins)


def test_broken_and_linked_configs_in_the_conf_dir(tmp_path: Path) -> None:
    (tmp_path / "10-a.conflist").write_bytes(b"\xff\xfe")
    (tmp_path / "20-b.conf").write_text(json.dumps({"name": "b", "type": "bridge", "cniVersion": "0.4.0"}))
    (tmp_path / "30-link.conflist").symlink_to(tmp_path / "20-b.conf")  # admins do this; followed
    (tmp_path / "40-dangling.json").symlink_to(tmp_path / "nowhere")
    (tmp_path / "README").write_text("not a config")
    configs, corrupt = collect_configs(str(tmp_path))
    assert [c.path.rsplit("/", 1)[1] for c in configs] == ["20-b.conf", "30-link.conflist"]
    assert sorted(c.path.rsplit("/", 1)[1] for c in corrupt) == ["10-a.conflist", "40-dangling.json"]


def test_a_network_in_two_conf_dirs_is_the_first_dirs(tmp_path: Path) -> None:
    """Two runtimes' conf dirs: each dir's configs count, and a name in both is the first
    dir's (the serving runtime's), as libcni takes the first file that has it."""
    first, second = tmp_path / "crio", tmp_path / "ctd"
    first.mkdir()
    second.mkdir()
    (first / "10-pods.conf").write_text(json.dumps({"name": "pods", "type": "bridge", "cniVersion": "1.0.0"}))
    (second / "05-pods.conf").write_text(json.dumps({"name": "pods", "type": "ptp", "cniVersion": "1.0.0"}))
    (second / "20-other.conf").write_text(json.dumps({"name": "other", "type": "ptp", "cniVersion": "1.0.0"}))
    (second / "30-bad.conf").write_text("{")
    configs, corrupt = collect_configs_of([str(first), str(second), str(tmp_path / "missing")])
    assert [(c.name, c.plugin_types) for c in configs] == [("pods", ("bridge",)), ("other", ("ptp",))]
    assert [c.path for c in corrupt] == [str(second / "30-bad.conf")]


def test_use_pod_cidr_is_a_valid_config_whose_range_is_not_known_here(tmp_path: Path) -> None:
    # Calico's and Canal's host-local blocks: "subnet": "usePodCidr", filled in by the plugin.
    config = {
        "cniVersion": "0.3.1",
        "name": "k8s-pod-network",
        "plugins": [
            {"type": "calico", "ipam": {"type": "host-local", "subnet": "usePodCidr"}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (tmp_path / "10-calico.conflist").write_text(json.dumps(config))
    (parsed,), corrupt = collect_configs(str(tmp_path))
    assert corrupt == [] and parsed.name == "k8s-pod-network" and parsed.ipam_ranges == ()
    assert parsed.pod_cidr_versions == (4,)


@pytest.mark.parametrize(
    ("ipam", "versions"),
    [
        # projectcalico/calico cni-plugin utils.go ReplaceHostLocalIPAMPodCIDRs: the top-level subnet
        # and every range's, compared with strings.EqualFold
        ({"subnet": "usepodcidr"}, (4,)),
        ({"subnet": "USEPODCIDRIPV6"}, (6,)),
        # the operator's dual-stack block (tigera/operator buildHostLocalIPAM)
        ({"ranges": [[{"subnet": "usePodCidr"}], [{"subnet": "usePodCidrIPv6"}]]}, (4, 6)),
        ({"ranges": [[{"subnet": "usePodCidr"}], [{"subnet": "fd00:1::/64"}]]}, (4,)),
        ({"subnet": "usePodCidrIPv4"}, None),  # not a placeholder: a bad subnet
    ],
)
def test_pod_cidr_placeholders_are_read_as_calico_reads_them(
    ipam: dict[str, object], versions: tuple[int, ...] | None
) -> None:
    raw = json.dumps(
        {"cniVersion": "0.3.1", "name": "k8s-pod-network", "type": "calico", "ipam": {"type": "host-local", **ipam}}
    )
    if versions is None:
        with pytest.raises(ConfigError):
            parse_network_config(raw.encode(), "/x.conf")
        return
    assert parse_network_config(raw.encode(), "/x.conf").pod_cidr_versions == versions


def test_flannels_range_comes_from_its_subnet_file(tmp_path: Path) -> None:
    # flannel-io/flannel pkg/subnet/subnet.go WriteSubnetFile: the first usable IP with the
    # lease's mask; the plugin (flannel.go loadFlannelSubnetEnv) takes its network.
    subnet_env = tmp_path / "subnet.env"
    subnet_env.write_text(
        "FLANNEL_NETWORK=10.42.0.0/16\nFLANNEL_SUBNET=10.42.3.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
    )
    conf = tmp_path / "net.d"
    conf.mkdir()
    # k3s pkg/agent/flannel/setup_linux.go: the conflist k3s writes, with the subnet file named.
    flannel = {"type": "flannel", "subnetFile": str(subnet_env), "delegate": {"hairpinMode": True}}
    config = {"name": "cbr0", "cniVersion": "1.0.0", "plugins": [flannel, {"type": "portmap"}]}
    (conf / "10-flannel.conflist").write_text(json.dumps(config))
    (parsed,), corrupt = collect_configs(str(conf))
    assert corrupt == []
    assert [(r.subnet, r.start, r.end) for r in parsed.ipam_ranges] == [("10.42.3.0/24", "10.42.3.1", "10.42.3.254")]
    subnet_env.unlink()
    (parsed,), _ = collect_configs(str(conf))
    assert parsed.ipam_ranges == (), "no subnet file yet: no range, and not corrupt"


@pytest.mark.parametrize("kind", ["fifo", "huge", "garbage", "symlink-to-dev-zero"])
def test_a_hostile_subnet_file_gives_no_range_and_never_blocks(tmp_path: Path, kind: str) -> None:
    subnet_env = tmp_path / "subnet.env"
    if kind == "fifo":
        os.mkfifo(subnet_env)
    elif kind == "huge":
        with subnet_env.open("wb") as f:
            f.truncate(MAX_CONFIG_BYTES + 1)
    elif kind == "garbage":
        subnet_env.write_bytes(b"FLANNEL_SUBNET=not-a-cidr\n\xff\x00FLANNEL_SUBNET=\n" + b"=" * 1000)
    else:
        subnet_env.symlink_to("/dev/zero")
    conf = tmp_path / "net.d"
    conf.mkdir()
    config = {"name": "cbr0", "cniVersion": "1.0.0", "plugins": [{"type": "flannel", "subnetFile": str(subnet_env)}]}
    (conf / "10-flannel.conflist").write_text(json.dumps(config))
    (parsed,), corrupt = collect_configs(str(conf))
    assert corrupt == [] and parsed.ipam_ranges == ()


@pytest.mark.parametrize(
    ("plugins", "stateful"),
    [
        # flannel hands an IPAM section without a type to its delegate: no IPAM plugin of its own
        ([{"type": "flannel", "ipam": {"dataDir": "/var/lib/cni/networks"}}], ()),
        ([{"type": "bridge", "ipam": {}}], ()),
        ([{"type": "bridge", "ipam": {"type": 7}}], ()),
        ([{"type": "bridge", "ipam": {"type": "host-local"}}], ()),
        # every spelling Go's decoder takes, of the key and of its type
        ([{"type": "bridge", "IPAM": {"Type": "dhcp"}}], ("dhcp",)),
        ([{"type": "bridge", "ipam": {"type": "whereabouts"}}, {"type": "cilium-cni"}], ("whereabouts", "cilium-cni")),
    ],
)
def test_stateful_plugins_are_the_plugins_and_ipam_types_a_chain_runs(
    plugins: list[dict[str, object]], stateful: tuple[str, ...]
) -> None:
    """No plugin named "None" for an IPAM section without a type: that kept the whole of every
    flannel attachment (its pin and veth too) as if a plugin only DEL frees held it."""
    raw = json.dumps({"cniVersion": "1.0.0", "name": "net1", "plugins": plugins}).encode()
    assert stateful_plugins(raw) == stateful
