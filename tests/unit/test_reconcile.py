"""reconcile: grouping, verdicts and the safety rules, on synthetic snapshots."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from reaper.kinds.netconf import parse_network_config
from reaper.model import AttachmentHistory, Holder, NetworkConfig, NsKey, Policy, ScanReport
from reaper.reconcile import reconcile
from tests.harness.snapshots import (
    HOST,
    NOW,
    OLD,
    POLICY,
    cache,
    chain,
    cid,
    lease,
    pin,
    runtime,
    sandbox,
    snapshot,
    veth,
)


def by_cid(report: ScanReport) -> dict[str | None, list[str]]:
    out: dict[str | None, list[str]] = {}
    for a in report.attachments:
        out.setdefault(a.key.container_id, []).append(a.verdict)
    return out


def test_full_attachment_groups_all_kinds() -> None:
    snap = snapshot(
        pins=(pin(1, OLD),), veths=(veth(1),), leases=(lease(1, OLD),), caches=(cache(1, OLD),), chains=(chain(1),)
    )
    report, _ = reconcile(snap, runtime(), {}, POLICY, NOW)
    assert len(report.attachments) == 1
    kinds = sorted(r.kind for r in report.attachments[0].resources)
    assert kinds == ["cache", "ipam", "iptables", "netns", "veth"]


def test_partial_add_without_cache_joins_through_sandbox_netns() -> None:
    # The seed's chained-plugin failure: lease, chain, veth and pin, no cache entry, NOTREADY sandbox.
    snap = snapshot(pins=(pin(1, OLD),), veths=(veth(1),), leases=(lease(1, OLD),), chains=(chain(1),))
    report, _ = reconcile(snap, runtime(sandbox(1, ready=False, created_at=OLD)), {}, POLICY, NOW)
    assert len(report.attachments) == 1
    a = report.attachments[0]
    assert a.verdict == "live" and "NOTREADY" in a.reason
    assert sorted(r.kind for r in a.resources) == ["ipam", "iptables", "netns", "veth"]
    assert [s.id for s in report.stuck_sandboxes] == [cid(1)]
    assert len(report.stuck_sandboxes[0].resources) == 4


def test_runtime_forgot_partial_add_gives_pin_of_its_own() -> None:
    snap = snapshot(pins=(pin(1, OLD),), veths=(veth(1),), leases=(lease(1, OLD),), chains=(chain(1),))
    history: dict[str, AttachmentHistory] = {}
    for _ in range(2):
        report, history = reconcile(snap, runtime(), history, POLICY, NOW)
    keys = {(a.key.container_id, a.verdict, tuple(sorted(r.kind for r in a.resources))) for a in report.attachments}
    assert keys == {(cid(1), "orphan", ("ipam", "iptables")), (None, "orphan", ("netns", "veth"))}


def test_confirmations_and_min_age() -> None:
    snap = snapshot(leases=(lease(1, OLD),), caches=(cache(1, OLD, with_netns=False),))
    first, history = reconcile(snap, runtime(), {}, POLICY, NOW)
    assert first.attachments[0].verdict == "pending" and "1 of 2" in first.attachments[0].reason
    second, history = reconcile(snap, runtime(), history, POLICY, NOW + 60)
    assert second.attachments[0].verdict == "orphan"
    young = snapshot(leases=(lease(1, NOW - 30),))
    report, _ = reconcile(young, runtime(), history, POLICY, NOW)
    assert report.attachments[0].verdict == "pending" and "min-age" in report.attachments[0].reason


@given(carried=st.integers(0, 2**40), confirmations=st.integers(1, 5))
def test_a_count_from_the_state_file_never_stands_for_more_than_confirmations_less_one(
    carried: int, confirmations: int
) -> None:
    """Whoever writes the state dir raises a count: this pass's own miss is still needed (the
    new count is at most `confirmations`, and an owner seen now resets it), and a first-seen
    time after now is now."""
    policy = replace(POLICY, confirmations=confirmations)
    snap = snapshot(leases=(lease(1, OLD),), caches=(cache(1, OLD, with_netns=False),))
    key = f"{cid(1)}/{snap.of('ipam')[0].network}/eth0"
    forged = {key: AttachmentHistory(NOW + 10**9, carried)}
    report, history = reconcile(snap, runtime(), forged, policy, NOW)
    (a,) = report.attachments
    assert history[key].orphan_streak == min(carried, confirmations - 1) + 1 <= confirmations
    assert history[key].first_seen == NOW
    assert (a.verdict == "orphan") == (min(carried, confirmations - 1) + 1 >= confirmations)
    owned, history = reconcile(snap, runtime(sandbox(1)), forged, policy, NOW)
    assert owned.attachments[0].verdict == "live" and history[key].orphan_streak == 0


def test_unreachable_runtime_resets_confirmations() -> None:
    snap = snapshot(leases=(lease(1, OLD),))
    _, history = reconcile(snap, runtime(), {}, POLICY, NOW)
    down, history = reconcile(snap, runtime(reachable=False), history, POLICY, NOW + 60)
    assert down.attachments[0].verdict == "unknown"
    again, _ = reconcile(snap, runtime(), history, POLICY, NOW + 120)
    assert again.attachments[0].verdict == "pending"


def test_process_in_netns_keeps_it_live_but_a_plugin_does_not() -> None:
    snap = snapshot(pins=(pin(1, OLD),))
    holders = ((NsKey(4, 1001), (Holder(pid=77, comm="sleep", is_cni_plugin=False),)),)
    live_snap = replace(snap, netns_holders=holders)
    report, _ = reconcile(live_snap, runtime(), {}, POLICY, NOW)
    assert report.attachments[0].verdict == "live" and "pid 77" in report.attachments[0].reason
    own = ((NsKey(4, 1001), (Holder(pid=78, comm="bridge", is_cni_plugin=True, reapers_own=True),)),)
    own_snap = replace(snap, netns_holders=own)
    report, _ = reconcile(own_snap, runtime(), {}, POLICY, NOW)
    assert report.attachments[0].verdict == "pending", "the reaper's own DEL does not keep it alive"
    # A plugin the runtime started is an ADD (or DEL) in progress: hands off.
    theirs = ((NsKey(4, 1001), (Holder(pid=79, comm="bridge", is_cni_plugin=True),)),)
    theirs_snap = replace(snap, netns_holders=theirs)
    report, _ = reconcile(theirs_snap, runtime(), {}, POLICY, NOW)
    assert report.attachments[0].verdict == "live" and "ADD or DEL in progress" in report.attachments[0].reason


def test_the_reason_names_every_process_inside_but_the_first_few() -> None:
    snap = snapshot(pins=(pin(1, OLD),))
    inside = tuple(Holder(pid=100 + i, comm="sh", is_cni_plugin=False) for i in range(8))
    report, _ = reconcile(replace(snap, netns_holders=((NsKey(4, 1001), inside),)), runtime(), {}, POLICY, NOW)
    assert report.attachments[0].reason == (
        "pid 100 (sh) is inside its netns, and pids 101, 102, 103, 104, 105 and 2 more"
    )
    report, _ = reconcile(replace(snap, netns_holders=((NsKey(4, 1001), inside[:2]),)), runtime(), {}, POLICY, NOW)
    assert report.attachments[0].reason == "pid 100 (sh) is inside its netns, and pids 101"


def test_host_netns_named_by_cache_is_live() -> None:
    entry = cache(1, OLD)
    hostile = replace(entry, netns_path="/proc/1/ns/net", netns=HOST)
    report, _ = reconcile(snapshot(caches=(hostile,)), runtime(), {}, POLICY, NOW)
    assert report.attachments[0].verdict == "live" and "host" in report.attachments[0].reason


def test_foreign_pin_is_reported_not_an_attachment() -> None:
    snap = snapshot(pins=(pin(5, OLD, runtime_named=False, name="test"),))
    report, _ = reconcile(snap, runtime(), {}, POLICY, NOW)
    assert report.attachments == ()
    assert [p.name for p in report.foreign_pins] == ["test"]


def test_a_chain_whose_container_has_nothing_else_here_is_unconfirmed_forever() -> None:
    """Its hash proves whose it is, but nothing proves that owner dead: no attachment of its
    own, never an orphan, however many passes see it."""
    snap = snapshot(chains=(chain(1),))
    history: dict[str, AttachmentHistory] = {}
    for n in range(3):
        report, history = reconcile(snap, runtime(), history, POLICY, NOW + 700 * n)
        assert report.attachments == () and [u.resource.name for u in report.unconfirmed] == [chain(1).chain]
    # With a lease of the same container on the same network, the chain joins its attachment.
    report, _ = reconcile(snapshot(chains=(chain(1),), leases=(lease(1, OLD),)), runtime(), {}, POLICY, NOW)
    assert report.unconfirmed == () and sorted(r.kind for r in report.attachments[0].resources) == ["ipam", "iptables"]


# ------------------------------------------------------------------ properties

ids = st.integers(min_value=1, max_value=12)


@st.composite
def worlds(draw: st.DrawFn) -> tuple:  # type: ignore[type-arg]
    pins = draw(st.sets(ids, max_size=8))
    leases = draw(st.sets(ids, max_size=8))
    caches = draw(st.sets(ids, max_size=8))
    chains = draw(st.sets(ids, max_size=8))
    veths = draw(st.sets(ids, max_size=8))
    listed = draw(st.sets(ids, max_size=8))
    listed_netns_only = draw(st.sets(ids, max_size=4))
    ages = draw(st.dictionaries(ids, st.floats(min_value=0, max_value=7200), min_size=12, max_size=12))
    streaks = draw(st.dictionaries(st.sampled_from([f"{cid(i)}/mynet/eth0" for i in range(1, 13)]), st.integers(0, 5)))
    snap = snapshot(
        pins=tuple(pin(i, NOW - ages.get(i, 0)) for i in sorted(pins)),
        veths=tuple(veth(i) for i in sorted(veths)),
        leases=tuple(lease(i, NOW - ages.get(i, 0)) for i in sorted(leases)),
        caches=tuple(cache(i, NOW - ages.get(i, 0), with_netns=i % 2 == 0) for i in sorted(caches)),
        chains=tuple(chain(i) for i in sorted(chains)),
    )
    sandboxes = [sandbox(i, ready=i % 3 != 0) for i in sorted(listed)]
    # Sandboxes whose ID the node never saw but whose netns it did (a runtime that renamed).
    sandboxes += [replace(sandbox(i), id=f"{i + 100:064x}") for i in sorted(listed_netns_only)]
    history = {k: AttachmentHistory(NOW - 10_000, v) for k, v in streaks.items()}
    policy = Policy(
        min_age=draw(st.sampled_from([0.0, 60.0, 600.0])), confirmations=draw(st.integers(1, 3)), stuck_after=900.0
    )
    reachable = draw(st.booleans())
    return snap, runtime(*sandboxes, reachable=reachable), history, policy


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_safety_properties(world: tuple) -> None:  # type: ignore[type-arg]
    snap, rt, history, policy = world
    report, new_history = reconcile(snap, rt, history, policy, NOW)
    listed_ids = {s.id for s in rt.sandboxes}
    listed_netns = {s.netns for s in rt.sandboxes if s.netns is not None}
    for a in report.attachments:
        if a.verdict != "orphan":
            continue
        assert rt.reachable, "nothing is an orphan when liveness failed"
        assert a.key.container_id not in listed_ids, "a listed sandbox's attachment is never an orphan"
        assert a.netns not in listed_netns, "a listed sandbox's netns is never an orphan's"
        assert a.age_seconds >= policy.min_age, "nothing younger than min-age is an orphan"
        assert new_history[a.key.as_text()].orphan_streak >= policy.confirmations
    # Every resource lands in exactly one attachment (or the foreign list).
    counted = sum(len(a.resources) for a in report.attachments) + len(report.foreign_pins) + len(report.unconfirmed)
    # A veth counts only where its peer's namespace is pinned; a name alone ties it to nothing.
    resolved_veths = sum(1 for v in snap.of("veth") if any(p.ns == v.peer_netns for p in snap.of("netns")))
    assert counted == resolved_veths + sum(len(snap.of(k)) for k in ("netns", "ipam", "cache", "iptables"))


def test_a_lease_naming_a_live_sandbox_in_another_network_is_live() -> None:
    other = lease(1, OLD, net="othernet")
    report, _ = reconcile(snapshot(leases=(other,)), runtime(sandbox(1)), {}, POLICY, NOW)
    (a,) = report.attachments
    assert a.key.network == "othernet" and a.verdict == "live" and "is listed" in a.reason


def test_a_veth_goes_where_its_peer_lives_not_where_a_cache_entry_names_it() -> None:
    # A recreated pod's veth keeps its predecessor's name (plugins that name it after the pod):
    # the predecessor's stale entry names the live pod's veth.
    live_veth = veth(1)
    stale = replace(cache(2, OLD, with_netns=False), host_ifnames=(live_veth.name,))
    snap = snapshot(pins=(pin(1, OLD),), veths=(live_veth,), caches=(cache(1, OLD), stale))
    report, _ = reconcile(snap, runtime(sandbox(1)), {}, POLICY, NOW)
    kinds_of = {a.key.container_id: sorted(r.kind for r in a.resources) for a in report.attachments}
    assert kinds_of == {cid(1): ["cache", "netns", "veth"], cid(2): ["cache"]}
    # A veth whose peer is in no pinned namespace ties to nothing at all.
    report, _ = reconcile(
        snapshot(veths=(veth(3, resolved=False),), caches=(cache(3, OLD),)), runtime(), {}, POLICY, NOW
    )
    assert [sorted(r.kind for r in a.resources) for a in report.attachments] == [["cache"]]


def test_the_report_names_the_conf_dirs_networks_not_the_ones_cache_entries_carry() -> None:
    def config(name: str, path: str) -> NetworkConfig:
        return parse_network_config(f'{{"cniVersion": "1.0.0", "name": "{name}", "type": "bridge"}}'.encode(), path)

    configs = (config("a", "/etc/cni/net.d/a.conf"), config("b", "/b.conf"), config("a", "/c.conf"),
               config("stray", "cache:/var/lib/cni/results/stray-1-eth0"))  # fmt: skip
    report, _ = reconcile(replace(snapshot(), configs=configs), runtime(), {}, POLICY, NOW)
    assert report.networks == ("a", "b")
