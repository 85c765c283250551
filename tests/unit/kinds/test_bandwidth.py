"""The bandwidth plugin's IFBs: the name the plugin gives them, which links are them, how they
join attachments, and the compare before each delete."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

import reaper.kinds
from reaper.correlate import correlate
from reaper.host.netlink import RawLink, kernel_filters_by_kind, parse_link
from reaper.kinds import ReclaimContext, bandwidth
from reaper.kinds.bandwidth import KIND, IfbDevice, ifb_name, ifbs_from
from reaper.kinds.registry import REGISTRY
from reaper.model import Claim
from tests.harness.fuzz import FUZZ, hostile_names
from tests.harness.snapshots import NET, cache, cid, lease, pin, runtime, snapshot

# (network name, container ID, the IFB name the plugin gave it).
# The first is the expected name in containernetworking/plugins
# plugins/meta/bandwidth/bandwidth_linux_test.go (network "cni-plugin-bandwidth-test",
# container "dummy"). The others are what Debian's bandwidth plugin (containernetworking-plugins
# 1.1.1+ds1-3+b5, /usr/lib/cni/bandwidth) named the IFB it made on ADD, read back from
# `ip link show type ifb` and from the interface it appended to its result, in a private netns.
VECTORS = [
    ("cni-plugin-bandwidth-test", "dummy", "bwpa8eda89404b7"),
    ("k8s-pod-network", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "bwpce0bd88d2c9c"),
    ("mynet", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "bwp3ed2e54cedb0"),
    ("cbr0", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "bwp8777b8abe2b7"),
    ("a-network-name-that-is-rather-long.example", "bare-id", "bwp98bf5b60dd3d"),
]


@pytest.mark.parametrize(("network", "container_id", "expected"), VECTORS)
def test_the_name_is_the_plugins_own(network: str, container_id: str, expected: str) -> None:
    assert ifb_name(network, container_id) == expected
    assert KIND.key_of is not None
    for ifname in ("eth0", "net1"):  # the plugin's name ignores the interface
        assert KIND.key_of(container_id, network, ifname) == expected


def _link(name: str, kind: str | None = "ifb", ifindex: int = 7) -> RawLink:
    return RawLink(ifindex=ifindex, name=name, kind=kind, link=None, master=None, link_netnsid=None)


def test_only_ifbs_named_as_the_plugin_names_them_are_records() -> None:
    good = "bwp0123456789ab"
    links = [
        _link(good, ifindex=1),
        _link("ifb0", ifindex=2),  # the ifb module's own devices
        _link("bwp0123456789a", ifindex=3),  # 11 hex
        _link("bwp0123456789abc", ifindex=4),  # 13 hex
        _link("bwp0123456789AB", ifindex=5),  # uppercase: %x never writes it
        _link("BWP0123456789ab", ifindex=6),
        _link("bwp0123456789ag", ifindex=7),
        _link("bwq0123456789ab", ifindex=8),
        _link("xbwp0123456789a", ifindex=9),
        _link(good + "\n", ifindex=10),
        _link("bwp٠١٢٣٤٥٦٧٨٩ab", ifindex=11),  # digits, but not ASCII ones
        _link(good, kind="veth", ifindex=12),  # the right name on another kind of link
        _link(good, kind="dummy", ifindex=13),
        _link(good, kind=None, ifindex=14),
        _link(good, kind="IFB", ifindex=15),
    ]
    assert ifbs_from(links) == [IfbDevice(1, good)]


@FUZZ
@given(st.text(max_size=20) | hostile_names, st.none() | st.sampled_from(["ifb", "veth", "", "ifb\x00"]))
def test_no_other_link_ever_is_a_record(name: str, kind: str | None) -> None:
    records = ifbs_from([_link(name, kind)])
    ours = kind == "ifb" and len(name) == 15 and name[:3] == "bwp" and all(c in "0123456789abcdef" for c in name[3:])
    assert records == ([IfbDevice(7, name)] if ours else [])


def _nla(atype: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _newlink(ifindex: int, name: str, kind: str | None) -> bytes:
    attrs = _nla(3, name.encode() + b"\0")  # IFLA_IFNAME
    if kind is not None:
        attrs += _nla(18, _nla(1, kind.encode() + b"\0"))  # IFLA_LINKINFO { IFLA_INFO_KIND }
    body = struct.pack("=BxHiII", 0, 1, ifindex, 0, 0) + attrs  # ifinfomsg
    return struct.pack("=IHHII", 16 + len(body), 16, 2, 1, 0) + body  # RTM_NEWLINK, NLM_F_MULTI


def test_the_link_reader_gives_the_kind_and_name_the_kernel_sent() -> None:
    data = b"\xff" * 8 + _newlink(42, "bwp3ed2e54cedb0", "ifb") + _newlink(43, "bwp3ed2e54cedb1", None)
    first = parse_link(data, 8, struct.unpack_from("=I", data, 8)[0])
    second_at = 8 + struct.unpack_from("=I", data, 8)[0]
    second = parse_link(data, second_at, len(data) - second_at)
    assert (first.ifindex, first.name, first.kind) == (42, "bwp3ed2e54cedb0", "ifb")
    assert (second.ifindex, second.kind) == (43, None)
    assert ifbs_from([first, second]) == [IfbDevice(42, "bwp3ed2e54cedb0")]


def test_the_kernel_filters_by_kind_from_4_8() -> None:
    assert kernel_filters_by_kind("6.18.44-fc-v782") and kernel_filters_by_kind("4.8.0")
    assert kernel_filters_by_kind("5.4.0-150-generic") and kernel_filters_by_kind("10.0")
    assert not kernel_filters_by_kind("4.4.0-21-generic") and not kernel_filters_by_kind("3.10.0-1160.el7.x86_64")
    assert not kernel_filters_by_kind("") and not kernel_filters_by_kind("weird")


def test_an_ifb_joins_the_attachment_its_name_hashes_to_and_no_other() -> None:
    mine = IfbDevice(50, ifb_name(NET, cid(1)))
    other_net = IfbDevice(51, ifb_name("othernet", cid(1)))  # same container, a network it is not on
    nobody = IfbDevice(52, "bwp0123456789ab")
    base = snapshot(pins=(pin(1),), leases=(lease(1),), caches=(cache(1),))
    snap = replace(base, resources={**base.resources, "ifb": (mine, other_net, nobody)})
    assert KIND.tie(mine) == Claim(key=mine.name)
    result = correlate(snap, runtime(), REGISTRY)
    (group,) = result.groups
    assert group.key.container_id == cid(1)
    assert sorted(r.name for r in group.resources if r.kind == "ifb") == [mine.name]
    assert sorted(u.resource.name for u in result.unconfirmed) == sorted([other_net.name, nobody.name])
    ref = KIND.ref(mine)
    assert ref.identity == KIND.identity(mine) and ref.identity[0] == KIND.name == "ifb"
    assert ref.detail("ifindex") == 50 and ref.created_at is None


def _ctx() -> ReclaimContext:
    return ReclaimContext(
        netns_dirs=(), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=1.0, done={}
    )


def test_reclaim_deletes_by_index_only_while_the_index_still_is_that_ifb(monkeypatch: pytest.MonkeyPatch) -> None:
    kept, renamed, gone, failing = (IfbDevice(i, ifb_name(NET, cid(i))) for i in (1, 2, 3, 4))
    now = [_link(kept.name, ifindex=1), _link("bwp0123456789ab", ifindex=2), _link(failing.name, ifindex=4)]
    deleted: list[list[int]] = []

    def delete(indexes: Sequence[int]) -> dict[int, str | None]:
        deleted.append(list(indexes))
        return {i: ("Operation not permitted" if i == 4 else None) for i in indexes}

    monkeypatch.setattr(bandwidth, "dump_links_of_kind", lambda kind: now if kind == "ifb" else [])
    monkeypatch.setattr(reaper.kinds, "delete_links", delete)  # the shared delete_by_index
    done = KIND.reclaim([kept, renamed, gone, failing], _ctx())
    assert deleted == [[1, 4]]
    assert done[KIND.identity(kept)].ok and done[KIND.identity(gone)].ok
    assert not done[KIND.identity(renamed)].ok and "another link" in str(done[KIND.identity(renamed)].error)
    assert done[KIND.identity(failing)].error == "Operation not permitted"
    assert KIND.reclaim([], _ctx()) == {}
