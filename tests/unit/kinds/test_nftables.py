"""nft -j output: the masquerade and hostport rules and their owners."""

from __future__ import annotations

import json

from hypothesis import given

from reaper.kinds.nftables import NftOutputError, parse_rules
from reaper.names import is_cni_id
from tests.harness.fuzz import FUZZ, json_values

CID = "a" * 64


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


@FUZZ
@given(json_values)
def test_nft_parser_takes_any_json(doc: object) -> None:
    try:
        rules = parse_rules(json.dumps(doc))
    except NftOutputError:
        return
    assert all(is_cni_id(r.container_id) for r in rules)
