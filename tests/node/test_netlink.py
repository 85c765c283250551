"""The netlink reader on a real kernel: every pin's nsid is the one of the namespace it pins,
for more pins than four batches of requests (1,024), so that each veth is tied by its peer to
the right pin. (pyroute2's request loop, used before, answered a few pins of 2,250 with another pin's
nsid: a veth then joined another attachment than the one its peer lives in.)"""

from __future__ import annotations

from tests.harness.probe import run_probe
from tests.harness.probes import nsid_per_pin


def test_every_pin_gets_the_nsid_of_its_own_namespace() -> None:
    out = run_probe(nsid_per_pin, timeout=300)
    assert out == {"wrong": [], "moved": [], "asked": 1100, "distinct": 1100, "veths": 1100}
