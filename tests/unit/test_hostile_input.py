"""Every parser against hostile and broken input: no crash, only corrupt records or None."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reaper.inventory.cache import _Corrupt, collect_cache, parse_cache_file
from reaper.inventory.hostlocal import collect_leases, ip_key, parse_lease
from reaper.inventory.iptables import parse_save
from reaper.inventory.netconf import ConfigError, collect_configs, parse_network_config
from reaper.inventory.nftables import NftOutputError, parse_rules
from reaper.liveness.cri import netns_path_from_info
from reaper.names import is_cni_id, is_ifname
from reaper.reclaim.plugin_del import DelConfigError, plugin_list

CID = "f" * 64
# JSON values of every shape, nested a little.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
hostile_names = st.sampled_from(
    ["../../etc/passwd", "a/b", "a b", "a\nb", "..", ".", "", "-x", "x" * 2000, "é", "ok-name.v1", "\x00", "a;b=c"]
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300))
def test_lease_parser_takes_any_bytes(data: bytes) -> None:
    try:
        cid, ifname = parse_lease(data)
    except ValueError:
        return
    assert is_cni_id(cid) and (ifname is None or is_ifname(ifname))


@FUZZ
@given(st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()), st.text(max_size=80))
def test_cache_parser_takes_any_bytes(data: bytes, name: str) -> None:
    try:
        _, cid, net, ifname, _ = parse_cache_file(name, data, {"net1", "my-net.v2"})
    except _Corrupt:
        return
    assert is_cni_id(cid) and is_cni_id(net) and is_ifname(ifname)


@FUZZ
@given(json_values, hostile_names, hostile_names, hostile_names)
def test_cache_entries_with_hostile_ids_are_corrupt(result: object, cid: str, net: str, ifname: str) -> None:
    doc = {"kind": "cniCacheV1", "containerId": cid, "networkName": net, "ifName": ifname, "result": result}
    try:
        _, got_cid, got_net, got_if, _ = parse_cache_file("x", json.dumps(doc).encode(), set())
    except _Corrupt:
        assert not (is_cni_id(cid) and is_cni_id(net) and is_ifname(ifname))
        return
    assert (got_cid, got_net, got_if) == (cid, net, ifname)


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
    except DelConfigError:
        return
    assert is_cni_id(name) and all(isinstance(p["type"], str) for p in plugins)


iptables_lines = st.lists(
    st.sampled_from(
        [
            "*nat",
            ":CNI-0123456789abcdef01234567 - [0:0]",
            ":CNI-DN-0123456789abcdef01234 - [0:0]",
            '-A POSTROUTING -s 10.0.0.1/32 -m comment --comment "name: \\"n\\" id: \\"x\\"" -j CNI-0123456789abcdef01234567',
            '-A CNI-0123456789abcdef01234567 -m comment --comment "name: \\"../x\\" id: \\"a b\\"" -j ACCEPT',
            "-A CNI-HOSTPORT-DNAT -j CNI-DN-0123456789abcdef01234",
            "-A",
            "-A ",
            ":",
            "COMMIT",
            "-A X -j",
            '-A CNI-x --comment "unterminated',
        ]
    )
    | st.text(max_size=60),
    max_size=30,
)


@FUZZ
@given(iptables_lines)
def test_iptables_save_parser_takes_any_text(lines: list[str]) -> None:
    for chain in parse_save("\n".join(lines), "ipv4"):
        assert chain.chain.startswith("CNI-")
        assert chain.container_id is None or is_cni_id(chain.container_id)


@FUZZ
@given(json_values)
def test_nft_parser_takes_any_json(doc: object) -> None:
    try:
        rules = parse_rules(json.dumps(doc))
    except NftOutputError:
        return
    assert all(is_cni_id(r.container_id) for r in rules)


@FUZZ
@given(st.dictionaries(st.text(max_size=8), st.text(max_size=50) | json_values.map(json.dumps), max_size=4))
def test_cri_info_parser_takes_any_map(info: dict[str, str]) -> None:
    path = netns_path_from_info(info)
    assert path is None or isinstance(path, str)


@FUZZ
@given(st.text(max_size=50))
def test_ip_key_takes_any_text(text: str) -> None:
    key = ip_key(text)
    assert key is None or key[0] in (4, 6)


# ---------------------------------------------------------------------------- named cases


def test_hostile_names_on_disk_never_become_records(tmp_path: Path) -> None:
    ipam = tmp_path / "ipam"
    (ipam / "net1").mkdir(parents=True)
    (ipam / "net1" / "10.0.0.2").write_bytes(b"../../etc/passwd\r\neth0")
    (ipam / "net1" / "10.0.0.3").write_bytes(f"{CID}\r\neth0\n".encode() + b"\xff")
    (ipam / "net1" / "10.0.0.4").write_bytes(b"a b c\r\neth0")
    (ipam / "net1" / "10.0.0.5").write_bytes(f"{CID}\r\n../eth0".encode())
    (ipam / "bad net").mkdir()
    leases, corrupt = collect_leases([str(ipam)])
    assert leases == []
    assert len(corrupt) == 5

    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    for i, cid in enumerate(["../../x", "a\nb", "a b", "a/b"]):
        doc = {"kind": "cniCacheV1", "containerId": cid, "networkName": "net1", "ifName": "eth0"}
        (results / f"entry{i}").write_text(json.dumps(doc))
    (results / "huge").write_bytes(b" " * (5 << 20))
    os.mkfifo(results / "fifo")
    inventory = collect_cache(str(tmp_path / "cache"), {"net1"})
    assert inventory.entries == ()
    errors = {Path(c.path).name: c.error for c in inventory.corrupt}
    assert set(errors) == {"entry0", "entry1", "entry2", "entry3", "huge", "fifo"}
    assert "limit" in errors["huge"] and "not a regular file" in errors["fifo"]


def test_a_network_name_with_dashes_and_dots_is_read_from_json_not_the_file_name(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    conflist = {"cniVersion": "1.0.0", "name": "my-net.v2-a", "plugins": [{"type": "bridge"}]}
    doc = {
        "kind": "cniCacheV1",
        "containerId": CID,
        "networkName": "my-net.v2-a",
        "ifName": "eth0",
        "config": base64.b64encode(json.dumps(conflist).encode()).decode(),
    }
    (results / f"my-net.v2-a-{CID}-eth0").write_text(json.dumps(doc))
    inventory = collect_cache(str(tmp_path), set())
    (entry,) = inventory.entries
    assert (entry.network, entry.container_id, entry.ifname) == ("my-net.v2-a", CID, "eth0")
    assert [c.name for c in inventory.configs] == ["my-net.v2-a"]


def test_broken_and_linked_configs_in_the_conf_dir(tmp_path: Path) -> None:
    (tmp_path / "10-a.conflist").write_bytes(b"\xff\xfe")
    (tmp_path / "20-b.conf").write_text(json.dumps({"name": "b", "type": "bridge", "cniVersion": "0.4.0"}))
    (tmp_path / "30-link.conflist").symlink_to(tmp_path / "20-b.conf")  # admins do this; followed
    (tmp_path / "40-dangling.json").symlink_to(tmp_path / "nowhere")
    (tmp_path / "README").write_text("not a config")
    configs, corrupt = collect_configs(str(tmp_path))
    assert [c.path.rsplit("/", 1)[1] for c in configs] == ["20-b.conf", "30-link.conflist"]
    assert sorted(c.path.rsplit("/", 1)[1] for c in corrupt) == ["10-a.conflist", "40-dangling.json"]


@pytest.mark.parametrize("netns", ["/proc/1/ns/net", "/proc/self/ns/net", "relative/path", "/nonexistent", ""])
def test_a_cache_entrys_netns_is_never_taken_at_its_word(tmp_path: Path, netns: str) -> None:
    results = tmp_path / "results"
    results.mkdir()
    doc = {"kind": "cniCacheV1", "containerId": CID, "networkName": "n", "ifName": "eth0", "netns": netns}
    (results / f"n-{CID}-eth0").write_text(json.dumps(doc))
    (entry,) = collect_cache(str(tmp_path), set()).entries
    if netns == "/proc/self/ns/net":
        assert entry.netns is not None  # a real namespace: reconcile then sees who is inside
    elif netns == "/proc/1/ns/net":
        assert entry.netns is not None or entry.netns_uninspectable
    else:
        assert entry.netns is None and not entry.netns_uninspectable
