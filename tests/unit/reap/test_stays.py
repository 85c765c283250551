"""An address is freed only when no namespace on the node holds it (issue 31, point 9).

Cases from peers' GC tests, replayed against the kernel step with fake kinds (a pin kind that
keeps a namespace and a DEL needs, a lease kind with addresses):
- containernetworking/plugins#1289, host-local's store GC (plugins/ipam/host-local/backend/disk/
  gc_test.go): a container with two interfaces is two attachments, released one by one; a
  released address is allocatable again. Here: the second attachment of a pod whose pin stays
  keeps its lease; a freed pin frees its lease.
- antrea#8239/#8240: the GC released a running pod's lease because its record of ownership was
  incomplete, and erred towards releasing; the fix keeps an IP any record of the node still
  claims. Here: whatever keeps a namespace (a DEL not run, a busy pin, a veth in use, a pin
  another attachment owns, a look that could not read every pin) keeps the lease.
- containernetworking/cni libcni GCNetworkList: DEL of each stale cached attachment, then the
  plugins' GC; a DEL that fails leaves that attachment to the plugin. Here: a failed DEL keeps
  the pin, and the lease with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper.host.netns_addrs import NamespaceAddresses, NamespaceToRead
from reaper.kinds import Kind, netns, reclaim_order
from reaper.kinds import veth as veth_kind
from reaper.kinds.registry import REGISTRY
from reaper.model import Attachment, AttachmentKey, Done, NsKey, ReclaimOutcome
from reaper.reap.stays import UNTOUCHED, held_in_staying, kept_with_namespace, lives_in, staying_namespaces
from tests.harness import snapshots
from tests.harness.passes import bare_reclaimer
from tests.harness.reclaim_fakes import (
    FAKE,
    FAKE_LAST,
    FAKE_LEASE,
    FAKE_PIN,
    FakeLiveness,
    FakeNode,
    fake_plugin,
    plugin_config,
    request_for,
)
from tests.harness.snapshots import cid, runtime


def pod(node: FakeNode, n: int) -> Attachment:
    """Attachment n: its pin (keeping its namespace), a record no address needs, its lease and
    its cache entry."""
    ns = NsKey(4, 5000 + n)
    return node.attachment(
        n,
        node.add(f"pin-{n}", FAKE_PIN, ns),
        node.add(f"res-{n}"),
        node.add(f"lease-{n}", FAKE_LEASE),
        node.add(f"last-{n}", FAKE_LAST),
    )


def errors(outcome: ReclaimOutcome) -> dict[str, str | None]:
    return {r.name: r.error for r in outcome.resources}


def test_a_freed_pin_frees_its_lease(node: FakeNode) -> None:
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run([pod(node, 1)], {})
    assert outcomes[0].ok and node.records == {}
    assert node.batches == [["pin-1"], ["res-1"], ["lease-1"], ["last-1"]]


def test_a_pin_kept_for_a_del_that_did_not_run_keeps_its_lease(node: FakeNode) -> None:
    """--method kernel (or no config to run) on a chain that keeps state elsewhere: the pin and
    the cache entry stay for the plugin's DEL; the lease, whose address is configured in that
    pin, stays too. Before: the lease was freed."""
    one, two = pod(node, 1), pod(node, 2)
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run(
        [one, two], {}, keep={one.key: "noop-stateful"}
    )
    why = errors(outcomes[0])
    assert why["res-1"] is None, "what no address needs goes"
    assert why["pin-1"] is not None and "noop-stateful may keep state" in why["pin-1"]
    lease = str(why["lease-1"])
    assert lease.startswith("kept: its address stays configured in the netns that fakepin pin-1 stays"), lease
    assert "noop-stateful" in lease
    assert {r.name for r in node.records.values()} == {"pin-1", "lease-1", "last-1"}
    assert outcomes[1].ok, "another pod's lease goes with its own pin"


def test_a_failed_del_keeps_the_pin_and_the_lease(node: FakeNode, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_plugin(bin_dir, del_fails=True)
    one = pod(node, 1)
    liveness = FakeLiveness(runtime())
    r = bare_reclaimer(
        look=node.look, registry=node.registry, observe=lambda: liveness.observe({}), bin_dirs=(str(bin_dir),)
    )
    outcomes, _ = r.run([one], {one.key: request_for(one, plugin_config())}, keep={one.key: "x-ipam"})
    assert outcomes[0].plugin_errors and outcomes[0].needs_plugin == "x-ipam"
    assert "stays configured in the netns that fakepin pin-1" in str(errors(outcomes[0])["lease-1"])
    assert ("fakelease", "lease-1") in node.records


@pytest.mark.parametrize("left", ["pin-1", "veth-1"])
def test_a_pin_or_veth_its_kind_leaves_keeps_the_lease(node: FakeNode, left: str) -> None:
    """Whatever keeps the namespace (a pin busy or not unlinked, a veth whose peer is in use):
    the lease stays, with that record's reason."""
    ns = NsKey(4, 5001)
    one = node.attachment(
        1, node.add("pin-1", FAKE_PIN, ns), node.add("veth-1", FAKE_PIN, ns), node.add("lease-1", FAKE_LEASE)
    )
    node.leave[left] = "held by pid 42"
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run([one], {})
    lease = str(errors(outcomes[0])["lease-1"])
    assert f"fakepin {left} stays (held by pid 42)" in lease, lease
    assert ("fakelease", "lease-1") in node.records


def test_the_second_interface_of_a_pod_keeps_its_lease_while_the_pods_pin_stays(node: FakeNode) -> None:
    """plugins#1289's two interfaces of one container: the pin joins the first attachment
    (eth0), the second (eth1) lives in the same namespace with a lease of its own. The first
    keeps the pin; the second's lease stays though no pin is among its records."""
    first = pod(node, 1)
    second = Attachment(
        key=AttachmentKey(cid(1), "net2", "eth1"),
        resources=(node.add("lease-1b", FAKE_LEASE),),
        netns=first.netns,
        verdict="orphan",
        reason="test",
        age_seconds=3600.0,
    )
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run(
        [first, second], {}, keep={first.key: "noop-stateful"}
    )
    assert "fakepin pin-1 stays" in str(errors(outcomes[1])["lease-1b"])
    assert ("fakelease", "lease-1b") in node.records


def test_a_pin_this_pass_does_not_reclaim_keeps_the_lease_of_its_namespace(node: FakeNode) -> None:
    """The pod's pin belongs to an attachment the pass did not take (over --max-reap, left at
    its re-check): the namespace is there, and the address in it."""
    ns = NsKey(4, 5001)
    node.add("pin-1", FAKE_PIN, ns)  # on the node, in no attachment this pass reclaims
    one = node.attachment(1, node.add("lease-1", FAKE_LEASE))
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run([one], {})
    assert f"fakepin pin-1 stays ({UNTOUCHED})" in str(errors(outcomes[0])["lease-1"])


def test_a_look_that_could_not_read_every_pin_keeps_every_lease(node: FakeNode) -> None:
    node.partly_read = frozenset({FAKE_PIN})
    one = node.attachment(1, node.add("lease-1", FAKE_LEASE), node.add("res-1", FAKE))
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run([one], {})
    why = errors(outcomes[0])
    assert "could not read every fakepin" in str(why["lease-1"]) and why["res-1"] is None


def test_a_lease_of_another_namespace_goes(node: FakeNode) -> None:
    """A namespace that stays keeps the addresses of its own attachments only."""
    node.add("pin-9", FAKE_PIN, NsKey(4, 9999))
    one = pod(node, 1)
    outcomes, _ = bare_reclaimer(look=node.look, registry=node.registry).run([one], {})
    assert outcomes[0].ok


def test_the_rule_is_pure_over_the_kinds_hooks() -> None:
    node = FakeNode()
    kinds = node.kinds
    one = pod(node, 1)
    present = {identity: record for identity, record in node.records.items()}
    ns = NsKey(4, 5001)
    assert lives_in(kinds, one, present) == {ns}
    staying = staying_namespaces(kinds, present, {("fakepin", "pin-1"): Done.left("busy")})
    assert staying == {ns: "fakepin pin-1 stays (busy)"}
    assert kept_with_namespace(kinds, one, present, staying) is not None
    assert staying_namespaces(kinds, present, {("fakepin", "pin-1"): Done.freed()}) == {}
    assert kept_with_namespace(kinds, one, present, {}) is None


def test_every_kind_that_keeps_a_namespace_is_reclaimed_before_every_kind_with_addresses() -> None:
    keepers = [i for i, k in enumerate(REGISTRY.reclaim_order) if k.keeps_netns is not None]
    freers = [i for i, k in enumerate(REGISTRY.reclaim_order) if k.with_addresses]
    assert [REGISTRY.reclaim_order[i].name for i in keepers] == ["netns", "veth"]
    assert {REGISTRY.reclaim_order[i].name for i in freers} == {"ipam", "firewall", "iprule", "iptables", "nft"}
    assert max(keepers) < min(freers)
    # Every kind that frees an address the address check weighs goes with its namespace too.
    assert all(k.with_addresses for k in REGISTRY.kinds if k.frees is not None)
    lease_kind: Kind[object] = FakeNode().kinds[2]
    pin_kind: Kind[object] = FakeNode().kinds[0]
    with pytest.raises(ValueError, match="is reclaimed before"):
        reclaim_order((lease_kind, pin_kind))


class FakeReader:
    """Reads the namespaces the kernel step asks for from a table: (addresses, error) by namespace."""

    def __init__(self, table: dict[NsKey, tuple[tuple[str, ...], str | None]]) -> None:
        self.table = table
        self.asked: list[list[str]] = []

    def __call__(self, targets: Sequence[NamespaceToRead]) -> list[NamespaceAddresses]:
        self.asked.append([t.where for t in targets])
        return [NamespaceAddresses(t.ns, t.where, *self.table.get(t.ns, ((), None))) for t in targets]


def split_off(node: FakeNode, address: str) -> tuple[Attachment, Attachment]:
    """A runtime that forgot a sandbox leaves its pin and its files as two attachments: pin-1
    (kept for its chain's DEL), and a lease of no namespace whose address is configured in pin-1."""
    ns = NsKey(4, 5001)
    pinned = node.attachment(1, node.add("pin-1", FAKE_PIN, ns), node.add("last-1", FAKE_LAST))
    files = replace(node.attachment(2, node.add("lease-2", FAKE_LEASE, addresses=(f"{address}/24",))), netns=None)
    return pinned, files


def test_a_lease_whose_address_is_in_another_orphans_pin_that_stays_stays(node: FakeNode) -> None:
    """The address check does not read the pins of the pass's orphans (they go with it); one
    that stays after all is read, and a lease whose address is configured there stays."""
    pinned, files = split_off(node, "10.0.0.5")
    reader = FakeReader({NsKey(4, 5001): (("::ffff:10.0.0.5",), None)})
    r = bare_reclaimer(look=node.look, registry=node.registry)
    r.read_netns = reader
    outcomes, _ = r.run([pinned, files], {}, keep={pinned.key: "noop-stateful"})
    why = str(errors(outcomes[1])["lease-2"])
    assert why.startswith("kept: its address 10.0.0.5 is configured in the netns pinned at /fake/pin-1"), why
    assert ("fakelease", "lease-2") in node.records
    assert len(reader.asked) == 1 and "fakepin pin-1 stays" in reader.asked[0][0]


def test_a_pin_that_stays_and_cannot_be_read_keeps_every_lease_with_an_address(node: FakeNode) -> None:
    pinned, files = split_off(node, "10.0.0.5")
    r = bare_reclaimer(look=node.look, registry=node.registry)
    r.read_netns = FakeReader({NsKey(4, 5001): ((), "no such file")})
    outcomes, _ = r.run([pinned, files], {}, keep={pinned.key: "noop-stateful"})
    assert "cannot be told (no such file)" in str(errors(outcomes[1])["lease-2"])


def test_a_lease_of_an_address_no_staying_pin_holds_goes(node: FakeNode) -> None:
    pinned, files = split_off(node, "10.0.0.6")
    r = bare_reclaimer(look=node.look, registry=node.registry)
    r.read_netns = FakeReader({NsKey(4, 5001): (("10.0.0.5",), None)})
    outcomes, _ = r.run([pinned, files], {}, keep={pinned.key: "noop-stateful"})
    assert outcomes[1].ok and ("fakelease", "lease-2") not in node.records


def test_no_namespace_is_read_when_every_pin_of_the_pass_goes(node: FakeNode) -> None:
    pinned, files = split_off(node, "10.0.0.5")
    reader = FakeReader({})
    r = bare_reclaimer(look=node.look, registry=node.registry)
    r.read_netns = reader
    outcomes, _ = r.run([pinned, files], {})
    assert all(o.ok for o in outcomes) and reader.asked == []


def test_held_in_staying_compares_by_meaning_and_skips_the_attachments_own() -> None:
    ns = NsKey(4, 1)
    seen = [NamespaceAddresses(ns, "the netns pinned at /x", ("10.0.0.5",))]
    assert held_in_staying(["10.0.0.5/24"], set(), seen) is not None
    assert held_in_staying(["::ffff:a00:5"], set(), seen) is not None
    assert held_in_staying(["10.0.0.5"], {ns}, seen) is None, "its own namespace keeps it by the first rule"
    assert held_in_staying(["fe80::1", "not an address"], set(), seen) is None


def test_a_pin_and_a_veth_keep_their_namespace_and_a_stale_pin_keeps_none() -> None:
    """The registry's kinds: a pin keeps the namespace mounted on it, a host veth the one its
    peer lives in; a stale pin file keeps nothing, and the rule sees them in a real Records."""
    pin, veth = snapshots.pin(1), snapshots.veth(1)
    present = {netns.identity(pin): pin, veth_kind.identity(veth): veth}
    assert staying_namespaces(REGISTRY.kinds, present, {}) == {
        NsKey(4, 1001): f"netns {pin.name} stays ({UNTOUCHED})",
    }
    stale = replace(pin, is_namespace=False)
    assert staying_namespaces(REGISTRY.kinds, {netns.identity(stale): stale}, {}) == {}
    gone = {netns.identity(pin): Done.freed(), veth_kind.identity(veth): Done.left("peer in use")}
    assert staying_namespaces(REGISTRY.kinds, present, gone) == {
        NsKey(4, 1001): f"veth {veth.name} stays (peer in use)"
    }
