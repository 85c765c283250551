"""Unit tests of the pure parsers: each input shape, good and broken."""

from __future__ import annotations

import base64
import json

import pytest

from reaper.durations import format_duration, parse_duration
from reaper.inventory.cache import _Corrupt, parse_cache_file
from reaper.inventory.hostlocal import parse_lease
from reaper.inventory.iptables import chain_name, parse_save
from reaper.inventory.netconf import ConfigError, parse_network_config
from reaper.inventory.nftables import parse_rules
from reaper.liveness.cri import netns_path_from_info
from reaper.names import compile_netns_patterns, is_cni_id, is_ifname, is_runtime_netns_name

CID = "a" * 64


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("1.5h", 5400.0), ("250ms", 0.25), ("2d", 172800.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "-5", "1h30m", "m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (5, 600, 7200, 200000)] == ["5s", "10m", "2h", "2d"]


def test_names() -> None:
    assert is_cni_id(CID) and is_cni_id("my-net.v2_x")
    for bad in ("", "../x", "a/b", "a b", "-lead", "x\n", ".hidden"):
        assert not is_cni_id(bad), bad
    assert is_ifname("eth0") and not is_ifname("a" * 16) and not is_ifname("..") and not is_ifname("a:b")
    patterns = compile_netns_patterns(("test-.*",))
    assert is_runtime_netns_name("cni-1b2c3d4e-aaaa-bbbb-cccc-0123456789ab", patterns)
    assert is_runtime_netns_name("1b2c3d4e-aaaa-bbbb-cccc-0123456789ab", patterns)
    assert is_runtime_netns_name("test-1", patterns)
    assert not is_runtime_netns_name("cni-not-a-uuid", patterns)
    assert not is_runtime_netns_name("lab", patterns)


def test_lease_formats() -> None:
    assert parse_lease(f"{CID}\r\neth0".encode()) == (CID, "eth0")
    assert parse_lease(f"{CID}\n".encode()) == (CID, None)
    assert parse_lease(f"  {CID}  ".encode()) == (CID, None)
    for bad in (
        b"",
        b"\r\n",
        b"\xff\xfe",
        f"{CID}\r\neth0\r\nextra".encode(),
        b"../../etc\r\neth0",
        f"{CID}\r\na/b".encode(),
    ):
        with pytest.raises(ValueError):
            parse_lease(bad)


def _conflist(name: str = "mynet", **ipam: object) -> bytes:
    ipam_block = {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]], **ipam}
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [
                {"type": "bridge", "ipam": ipam_block},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
    ).encode()


def test_network_config_list_and_single() -> None:
    cfg = parse_network_config(_conflist(dataDir="/run/ipam"), "/x.conflist")
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


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[]", b'{"name": "x"}', b'{"name": "../x", "type": "bridge"}', b'{"name": "x", "plugins": [{}]}'],
)
def test_broken_network_configs(raw: bytes) -> None:
    with pytest.raises(ConfigError):
        parse_network_config(raw, "/z.conf")


def _cache_doc(**over: object) -> bytes:
    doc: dict[str, object] = {
        "kind": "cniCacheV1",
        "containerId": CID,
        "config": base64.b64encode(_conflist()).decode(),
        "ifName": "eth0",
        "networkName": "my-net.v1",
        "result": {
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0"},
                {"name": "veth1234abcd"},
                {"name": "eth0", "sandbox": "/var/run/netns/cni-x"},
            ],
        },
    }
    doc.update(over)
    return json.dumps(doc).encode()


def test_cache_v1() -> None:
    doc, cid, net, ifname, legacy = parse_cache_file(f"my-net.v1-{CID}-eth0", _cache_doc(), set())
    assert (cid, net, ifname, legacy) == (CID, "my-net.v1", "eth0", False)
    assert doc["result"]["interfaces"][2]["sandbox"] == "/var/run/netns/cni-x"


def test_cache_legacy_bare_result_uses_known_network_names() -> None:
    bare = json.dumps({"cniVersion": "0.3.1", "interfaces": [{"name": "eth0", "sandbox": "/x"}], "ips": []}).encode()
    _, cid, net, ifname, legacy = parse_cache_file(f"my-net-2-{CID}-eth0", bare, {"my-net-2"})
    assert (cid, net, ifname, legacy) == (CID, "my-net-2", "eth0", True)
    # Without a known network, a 64-hex container ID still splits the name unambiguously.
    _, cid, net, _, _ = parse_cache_file(f"other-net-{CID}-eth0", bare, set())
    assert (cid, net) == (CID, "other-net")
    with pytest.raises(_Corrupt, match="cannot tell"):
        parse_cache_file("a-b-c-eth0", bare, set())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (_cache_doc()[:40], "truncated"),
        (b"[1]", "not a JSON object"),
        (_cache_doc(containerId="../../etc"), "containerId"),
        (_cache_doc(networkName="a/b"), "networkName"),
        (_cache_doc(ifName="x" * 20), "ifName"),
        (_cache_doc(kind="cniCacheV9"), "unknown cache kind"),
        (b'{"foo": 1}', "neither"),
    ],
)
def test_cache_corrupt(data: bytes, message: str) -> None:
    with pytest.raises(_Corrupt, match=message):
        parse_cache_file("whatever", data, set())


def test_iptables_save_masquerade_and_portmap() -> None:
    masq = chain_name("", "mynet", CID)
    dn = chain_name("DN-", "mynet", CID)
    other = chain_name("", "mynet", "b" * 64)
    text = f"""# Generated by iptables-nft-save
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:{masq} - [0:0]
:{dn} - [0:0]
:{other} - [0:0]
:CNI-abcdefabcdefabcdefabcdef - [0:0]
-A POSTROUTING -s 10.88.0.5/32 -m comment --comment "name: \\"mynet\\" id: \\"{CID}\\"" -j {masq}
-A {masq} -d 10.88.0.0/24 -m comment --comment "name: \\"mynet\\" id: \\"{CID}\\"" -j ACCEPT
-A {masq} ! -d 224.0.0.0/4 -m comment --comment "name: \\"mynet\\" id: \\"{CID}\\"" -j MASQUERADE
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \\"mynet\\" id: \\"{CID}\\"" -m multiport --dports 8080 -j {dn}
-A {dn} -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.88.0.5:80
-A {other} -m comment --comment "name: \\"mynet\\" id: \\"{CID}\\"" -j ACCEPT
COMMIT
"""
    chains = {c.chain: c for c in parse_save(text, "ipv4")}
    assert chains[masq].purpose == "masquerade"
    assert (chains[masq].network, chains[masq].container_id) == ("mynet", CID)
    assert len(chains[masq].rules) == 2 and len(chains[masq].jumps) == 1
    assert chains[dn].purpose == "hostport-dnat"
    assert (chains[dn].network, chains[dn].container_id) == ("mynet", CID)
    # A comment naming an owner whose hash is not the chain's does not make it that owner's.
    assert chains[other].container_id is None
    assert chains["CNI-abcdefabcdefabcdefabcdef"].container_id is None
    assert "POSTROUTING" not in chains and "CNI-HOSTPORT-DNAT" not in chains


def test_nft_rules() -> None:
    rules = json.dumps(
        {
            "nftables": [
                {
                    "rule": {
                        "family": "inet",
                        "table": "cni_plugins_masquerade",
                        "chain": "masq_checks",
                        "handle": 7,
                        "comment": f"masq-cni, net: mynet, if: eth0, id: {CID}",
                    }
                },
                {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 9, "comment": CID}},
                {
                    "rule": {
                        "family": "ip",
                        "table": "cni_hostport",
                        "chain": "hostports",
                        "handle": 10,
                        "comment": "../x",
                    }
                },
                {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 11}},
            ]
        }
    )
    parsed = parse_rules(rules)
    assert [(r.handle, r.network, r.ifname, r.container_id) for r in parsed] == [
        (7, "mynet", "eth0", CID),
        (9, None, None, CID),
    ]


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
