"""AWS VPC CNI's per-pod policy rules: decoded from RTM_NEWRULE bytes as the kernel sends them,
kept only when shaped exactly as the plugin adds them, tied by their address to the one
container holding it, and deleted only as a fresh dump still shows them alone."""

from __future__ import annotations

import socket

from msgspec.structs import replace

from reaper.host.netlink import RawRule, parse_rule
from reaper.host.netns_addrs import NamespaceAddresses
from reaper.kinds import iprules
from reaper.kinds.iprules import PodRule, decide, pod_rule, pod_rules, tie, with_owners
from reaper.model import Attachment, AttachmentKey, Claim, Done, Identity, NsKey, ResourceRef
from reaper.reap.addresses import addresses_held, leave_for_addresses
from tests.harness.snapshots import cache, cid, lease

# RTM_NEWRULE messages of a rule dump (AF_UNSPEC) in a private netns, after
# `ip rule add to 10.77.0.5/32 lookup main pref 512`, `ip rule add from 10.77.0.5/32 lookup 2
# pref 1536`, `ip rule add from 10.77.0.9/32 iif eth9 lookup 2 pref 1536` and
# `ip -6 rule add from fd00:77::5/128 lookup 3 pref 1536` (kernel 6.x); captured, not built.
TO_V4 = bytes.fromhex(
    "4400000020000200010000009a6c000002200000fe0000010000000008000f00fe00000008000e00ffffffff05001500"
    "000000000800060000020000080001000a4d0005"
)
FROM_V4 = bytes.fromhex(
    "4400000020000200010000009a6c000002002000020000010000000008000f000200000008000e00ffffffff05001500"
    "000000000800060000060000080002000a4d0005"
)
FROM_V4_IIF = bytes.fromhex(
    "5000000020000200010000009a6c000002002000020000010800000008000f000200000008000e00ffffffff05001500"
    "000000000900030065746839000000000800060000060000080002000a4d0009"
)
FROM_V6 = bytes.fromhex(
    "5000000020000200010000009a6c00000a008000030000010000000008000f000300000008000e00ffffffff05001500"
    "00000000080006000006000014000200fd000077000000000000000000000005"
)


def _parse(data: bytes) -> RawRule:
    return parse_rule(data, 0, len(data))


def test_the_kernels_bytes_decode_to_the_rules_ip_rule_added() -> None:
    to = _parse(TO_V4)
    assert (to.family, to.priority, to.table, to.dst, to.dst_len, to.src, to.other) == (
        socket.AF_INET,
        512,
        254,
        "10.77.0.5",
        32,
        None,
        (),
    )
    frm = _parse(FROM_V4)
    assert (frm.priority, frm.table, frm.src, frm.src_len, frm.dst) == (1536, 2, "10.77.0.5", 32, None)
    v6 = _parse(FROM_V6)
    assert (v6.family, v6.table, v6.src, v6.src_len) == (socket.AF_INET6, 3, "fd00:77::5", 128)
    iif = _parse(FROM_V4_IIF)
    assert iif.other == (3,)  # FRA_IIFNAME: it selects by interface too


def test_an_attribute_running_past_the_message_ends_the_reading() -> None:
    cut = bytearray(FROM_V4)
    cut[-8:-6] = (200).to_bytes(2, "little")  # FRA_SRC's length now runs past the end
    rule = _parse(bytes(cut))
    assert rule.src is None and pod_rule(rule) is None


def test_only_the_plugins_two_shapes_are_records() -> None:
    found = pod_rules([_parse(m) for m in (TO_V4, FROM_V4, FROM_V4_IIF, FROM_V6)])
    assert [(r.direction, r.ip, r.rule.table) for r in found] == [
        ("to", "10.77.0.5", 254),
        ("from", "10.77.0.5", 2),
        ("from", "fd00:77::5", 3),
    ]
    to, frm = _parse(TO_V4), _parse(FROM_V4)
    others = [
        replace(to, priority=513),  # another priority
        replace(to, table=2),  # `to` looks up main only
        replace(to, dst_len=24),  # a subnet, not one host
        replace(to, flags=2),  # `not to`
        replace(to, tos=16),
        replace(to, action=2),  # goto
        replace(to, other=(10,)),  # fwmark
        replace(to, suppress_prefixlen=0),
        replace(frm, table=254),  # `from` never looks up main (a primary ENI's pod has none)
        replace(frm, table=255),
        replace(frm, dst="10.0.0.1", dst_len=32),  # from and to
        replace(frm, src_len=31),
        replace(frm, family=socket.AF_INET6),  # an address of the other family's length
    ]
    assert [pod_rule(r) for r in others] == [None] * len(others)


def _rule(ip: str = "10.0.0.2", direction: str = "to") -> PodRule:
    rule = _parse(TO_V4) if direction == "to" else _parse(FROM_V4)
    rule = replace(rule, dst=ip) if direction == "to" else replace(rule, src=ip)
    found = pod_rule(rule)
    assert found is not None
    return found


def test_a_rule_joins_the_one_container_holding_its_address() -> None:
    (held,) = with_owners([_rule(lease(0).ip)], [lease(0)], [])
    assert tie(held) == Claim(container_id=cid(0), network=lease(0).network)
    assert held.leases == (("ipam", lease(0).path),)
    by_cache = replace(cache(0), ips=("10.0.0.2/24",))
    (cached,) = with_owners([_rule("10.0.0.2")], [], [by_cache])
    assert tie(cached) == Claim(container_id=cid(0), network=by_cache.network)
    (both,) = with_owners([_rule("10.0.0.2", "from")], [lease(0)], [by_cache])
    assert tie(both) == Claim(container_id=cid(0), network=by_cache.network)


def test_an_address_no_one_or_two_containers_hold_joins_nothing() -> None:
    (stray,) = with_owners([_rule("192.0.2.7")], [lease(0)], [])
    assert tie(stray) == Claim() and "no lease" in stray.owner
    other = replace(cache(1), ips=("10.0.0.2",))
    (shared,) = with_owners([_rule(lease(0).ip)], [lease(0)], [other])
    assert tie(shared) == Claim() and "held by 2" in shared.owner


def test_frees_is_the_address_so_the_reclaim_paths_address_check_covers_it() -> None:
    assert list(iprules.frees(_rule("10.0.0.9", "from"))) == ["10.0.0.9"]
    assert iprules.KIND.frees is not None and iprules.KIND.claims is None


def test_a_rule_is_deleted_only_as_the_dump_still_shows_it_alone() -> None:
    rule = _rule("10.77.0.5")
    now = [_parse(TO_V4), _parse(FROM_V4)]
    assert decide([rule], now, {}) == {iprules.identity(rule): rule.rule}
    assert decide([rule], [_parse(FROM_V4)], {}) == {iprules.identity(rule): Done.freed()}
    shadow = replace(_parse(TO_V4), other=(3,))  # same priority, table, selector; an iif too
    verdict = decide([rule], [*now, shadow], {})[iprules.identity(rule)]
    assert isinstance(verdict, Done) and not verdict.ok


def test_a_rule_whose_lease_was_kept_this_pass_stays() -> None:
    (held,) = with_owners([_rule(lease(0).ip)], [lease(0)], [])
    kept: dict[Identity, Done] = {("ipam", lease(0).path): Done.left("in use")}
    verdict = decide([held], [replace(_parse(TO_V4), dst=lease(0).ip)], kept)[iprules.identity(held)]
    assert isinstance(verdict, Done) and not verdict.ok and "still leased" in (verdict.error or "")
    freed: dict[Identity, Done] = {("ipam", lease(0).path): Done.freed()}
    now = [replace(_parse(TO_V4), dst=lease(0).ip)]
    assert isinstance(decide([held], now, freed)[iprules.identity(held)], RawRule)


def test_a_rule_tied_by_a_forged_file_to_an_orphan_stays_while_a_live_pod_has_its_address() -> None:
    """A writer of /var/lib/cni ties a live pod's rule to a dead container (a forged lease or
    cached result holding its address): the rule's address is one the orphan frees, so the
    address check before acting leaves the orphan while another namespace has it configured."""
    (forged,) = with_owners([_rule("10.0.0.5", "from")], [], [replace(cache(9), ips=("10.0.0.5/24",))])
    assert tie(forged) == Claim(container_id=cid(9), network=cache(9).network)
    ident = iprules.identity(forged)
    ref = ResourceRef(kind=iprules.KIND.name, name="r", created_at=0.0, details={}, identity=ident)
    orphan = Attachment(
        key=AttachmentKey(cid(9), cache(9).network, "eth0"),
        resources=(ref,),
        netns=None,
        verdict="orphan",
        reason="no sandbox",
        age_seconds=600.0,
    )
    held = addresses_held(orphan, {ident: forged})
    assert [str(a) for a in held.addresses] == ["10.0.0.5"]
    live = NamespaceAddresses(NsKey(4, 200), "the netns of pid 4242", ("10.0.0.5",), None)
    reasons = leave_for_addresses({orphan.key: held}, [live], None)
    assert orphan.key in reasons and "10.0.0.5" in reasons[orphan.key]
