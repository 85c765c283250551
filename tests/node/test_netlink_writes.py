"""The reaper's one netlink writer on a real kernel (reaper/host/netlink.py): links and policy
rules deleted by hand-written requests, each answered for alone, a twin that differs in one
field left in place, and pyroute2 never loaded (it was the link writer before)."""

from __future__ import annotations

from tests.harness.probe import run_probe
from tests.harness.probes import netlink_writes


def test_links_and_rules_are_deleted_by_the_one_writer() -> None:
    out = run_probe(netlink_writes)
    assert out["links"] == {"veth": None, "ifb": None, "absent": None, "lo": "Operation not supported"}
    assert out["left_links"] == ["lo", "stay0", "stay0p"]
    assert out["rules"] == [None, None, None]
    assert out["left_rules"] == ["500 70001 fd00::5", "501 1000 10.1.0.5"]
    assert out["pyroute2_loaded"] is False
