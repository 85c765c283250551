"""nft -j output: the masquerade and hostport rules and their owners."""

from __future__ import annotations

import json

from hypothesis import given

from reaper.kinds.nftables import NftOutputError, instance_hash, parse_rules
from reaper.names import is_cni_id
from tests.harness.fuzz import FUZZ, json_values
from tests.harness.lab.cni import masq_comment

CID = "a" * 64


def _rule(table: str, handle: int, comment: str | None, family: str = "inet") -> dict[str, object]:
    rule: dict[str, object] = {"family": family, "table": table, "chain": "masq_checks", "handle": handle}
    if comment is not None:
        rule["comment"] = comment
    return {"rule": rule}


def test_the_instance_hash_is_the_plugins_own() -> None:
    # The expected comments of containernetworking/plugins pkg/ip/ipmasq_nftables_linux_test.go.
    assert instance_hash("unit-test", "eth0", "one") == "6fd94d501e58f0aa-287fc69eff0574a2"
    assert instance_hash("unit-test", "eth0", "two") == "6fd94d501e58f0aa-d750b2c8f0f25d5f"
    assert instance_hash("alternate", "net1", "three") == "82783ef24bdc7036-acb19d111858e348"


def test_nft_rules_carry_their_producers_key() -> None:
    long_net = "a-network-name-long-enough-to-cut"
    cut = masq_comment(long_net, "eth0", CID)
    assert len(cut) == 128 and not cut.endswith(CID)  # the ID in the description is cut short
    rules = json.dumps(
        {
            "nftables": [
                _rule("cni_plugins_masquerade", 7, masq_comment("mynet", "eth0", CID)),
                _rule("cni_plugins_masquerade", 8, cut),
                _rule("cni_plugins_masquerade", 12, "masq-cni, net: mynet, if: eth0, id: x"),  # no key: not ours
                _rule("cni_hostport", 9, CID, "ip"),
                _rule("cni_hostport", 10, "../x", "ip"),
                _rule("cni_hostport", 11, None, "ip"),
            ]
        }
    )
    parsed = {r.handle: r for r in parse_rules(rules)}
    assert set(parsed) == {7, 8, 9}
    assert parsed[7].instance == instance_hash("mynet", "eth0", CID) and parsed[7].container_id == CID
    assert parsed[8].instance == instance_hash(long_net, "eth0", CID) and parsed[8].container_id != CID
    assert (parsed[9].instance, parsed[9].container_id) == (None, CID)


@FUZZ
@given(json_values)
def test_nft_parser_takes_any_json(doc: object) -> None:
    try:
        rules = parse_rules(json.dumps(doc))
    except NftOutputError:
        return
    assert all(r.container_id is None or is_cni_id(r.container_id) for r in rules)


def test_names_that_would_be_script_text_are_never_read() -> None:
    """A chain name or family could end the `delete rule` statement and start another."""
    hostile = [
        {"rule": {"family": "ip", "table": "cni_hostport", "chain": "x; flush ruleset", "handle": 1, "comment": CID}},
        {"rule": {"family": "ip\nflush ruleset", "table": "cni_hostport", "chain": "c", "handle": 2, "comment": CID}},
        {"rule": {"family": "ip", "table": "cni_hostport", "chain": "c", "handle": -3, "comment": CID}},
        {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 4, "comment": CID}},
    ]
    assert [r.handle for r in parse_rules(json.dumps({"nftables": hostile}))] == [4]
