"""The plan of a reclaiming pass: the breaker, --max-reap, the re-check's reasons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from reaper.kinds.cache import CacheEntry
from reaper.kinds.registry import REGISTRY
from reaper.model import Attachment, AttachmentKey, Identity, NsKey, Verdict
from reaper.options import ReapPolicy
from reaper.reap.plan import COSTLESS_PER_PASS, breaker_counts, breaker_trips, costs_nothing, select
from tests.harness.snapshots import lease as snapshot_lease


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 500), st.integers(0, 500), st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 1.0]))
def test_the_breaker_opens_exactly_above_the_ratio(orphans: int, live: int, ratio: float) -> None:
    total = orphans + live
    assert breaker_trips(orphans, total, ratio) == (total > 0 and orphans * 1.0 / total > ratio)
    if total and orphans <= ratio * total:
        assert not breaker_trips(orphans, total, ratio)


def _attachment(
    n: int, verdict: Verdict, network: str = "net1", ifname: str = "eth0", netns: NsKey | None = None
) -> Attachment:
    return Attachment(
        key=AttachmentKey(f"{n:064x}", network, ifname),
        resources=(),
        netns=netns or NsKey(4, 1000 + n),
        verdict=verdict,
        reason="",
        age_seconds=0.0,
    )


def test_the_breaker_weighs_pods_not_their_loopbacks_nor_the_pending() -> None:
    # Three pods the runtime lists and one it forgot: each has eth0 and lo.
    live = [_attachment(n, "live") for n in range(3)] + [_attachment(n, "live", "cni-loopback", "lo") for n in range(3)]
    forgotten = [_attachment(9, "orphan"), _attachment(9, "orphan", "cni-loopback", "lo")]
    assert breaker_counts(live + forgotten) == (1, 4)
    young = [_attachment(20 + n, "pending") for n in range(10)]
    assert breaker_counts(live + forgotten + young) == (1, 4), "a burst of new pods does not dilute the ratio"


def test_attachments_in_no_namespace_never_open_the_breaker() -> None:
    """Files alone (a lease, a cache entry) are no pod's: whoever writes /var/lib/cni could
    forge any number of them, and they must not keep the breaker open for good."""
    live = [_attachment(n, "live") for n in range(3)]
    forged = [
        Attachment(
            key=AttachmentKey(f"{100 + n:064x}", "net1", "eth0"),
            resources=(),
            netns=None,
            verdict="orphan",
            reason="",
            age_seconds=0.0,
        )
        for n in range(50)
    ]
    assert breaker_counts(live + forged) == (0, 3)
    forgotten = [_attachment(9, "orphan")]
    assert breaker_counts(live + forged + forgotten) == (1, 4), "a pod's namespace still counts"


# ------------------------------------------------------------------------------ --max-reap


def _loopback(n: int, *, loopback_only: bool = True) -> CacheEntry:
    return CacheEntry(
        path=f"/cache/results/cni-loopback-{n:064x}-lo",
        name=f"cni-loopback-{n:064x}-lo",
        container_id=f"{n:064x}",
        network="cni-loopback",
        ifname="lo",
        netns_path=f"/run/netns/cni-{n}",
        netns=None,  # its pin is gone
        host_ifnames=(),
        legacy=False,
        mtime=0.0,
        cache_dir="/cache",
        owner="cri",
        ips=("127.0.0.1", "::1"),
        loopback_only=loopback_only,
    )


def _orphan(*records: Any, netns: NsKey | None = None) -> Attachment:
    refs = tuple(REGISTRY.by_name[kind_of(r)].ref(r) for r in records)
    return Attachment(
        key=AttachmentKey(records[0].container_id, records[0].network, records[0].ifname),
        resources=refs,
        netns=netns,
        verdict="orphan",
        reason="",
        age_seconds=3600.0,
    )


def kind_of(record: Any) -> str:
    return "cache" if isinstance(record, CacheEntry) else "ipam"


def _records(*attachments: Attachment, of: Sequence[Any]) -> dict[Identity, Any]:
    by_identity = {REGISTRY.by_name[kind_of(r)].identity(r): r for r in of}
    return {ref.identity: by_identity[ref.identity] for a in attachments for ref in a.resources}


POLICY = ReapPolicy(max_reap=2, max_orphan_ratio=0.5, kernel_only=False, quarantine_dir=None, force=False)


def test_max_reap_bounds_what_a_wrong_verdict_could_cost_not_costless_files() -> None:
    """30,000 stale loopback entries at --max-reap 100 took 300 passes (5 hours) to clean:
    --max-reap bounds what a wrong verdict could cost a pod (an address, a pin, a veth), and a
    loopback's entry alone costs none."""
    entries = [_loopback(n) for n in range(40)] + [_loopback(100 + n, loopback_only=False) for n in range(5)]
    orphans = [_orphan(e) for e in entries]
    records = _records(*orphans, of=entries)
    free = {a.key for a in orphans if costs_nothing(a, records)}
    assert len(free) == 40
    taken, deferred = select(orphans, POLICY, free)
    assert [a.key for a in taken] == [a.key for a in orphans[40:42]] + [a.key for a in orphans[:40]]
    assert [(s.key, s.reason) for s in deferred] == [(a.key, "over --max-reap 2; next pass") for a in orphans[42:]]


def test_files_alone_never_take_the_place_of_leaks_in_a_namespace() -> None:
    """Cache entries of a calico chain with no pin get a DEL with no netns; whoever can write
    /var/lib/cni could write any number of them each pass: they go after every leak in a
    namespace, within --max-reap."""
    entries = [_loopback(n, loopback_only=False) for n in range(4)]
    files = [_orphan(e) for e in entries[:2]]
    pinned = [_orphan(e, netns=NsKey(4, 7000 + n)) for n, e in enumerate(entries[2:])]
    taken, deferred = select([*files, *pinned], POLICY)
    assert [a.key for a in taken] == [a.key for a in pinned]
    assert [s.key for s in deferred] == [a.key for a in files]


def test_costless_files_have_a_bound_of_their_own_for_the_pass_time() -> None:
    entries = [_loopback(n) for n in range(COSTLESS_PER_PASS + 3)]
    orphans = [_orphan(e) for e in entries]
    taken, deferred = select(orphans, POLICY, {a.key for a in orphans})
    assert len(taken) == COSTLESS_PER_PASS
    assert [s.key for s in deferred] == [a.key for a in orphans[COSTLESS_PER_PASS:]]
    assert all(s.reason == f"over {COSTLESS_PER_PASS} costless files a pass; next pass" for s in deferred)


def test_an_attachment_costs_nothing_only_when_all_of_it_does() -> None:
    """A loopback's entry beside a lease of its key (forged or not), in a namespace, or not
    found by the look: a wrong verdict on it could cost a pod something."""
    entry, other = _loopback(1), _loopback(2, loopback_only=False)
    lease = replace(snapshot_lease(1), container_id=entry.container_id)
    alone = _orphan(entry)
    assert costs_nothing(alone, _records(alone, of=[entry]))
    with_lease = _orphan(entry, lease)
    assert not costs_nothing(with_lease, _records(with_lease, of=[entry, lease]))
    in_netns = _orphan(entry, netns=NsKey(4, 4242))
    assert not costs_nothing(in_netns, _records(in_netns, of=[entry]))
    assert not costs_nothing(alone, {}), "a record the look did not find"
    mixed = _orphan(entry, other)
    assert not costs_nothing(mixed, _records(mixed, of=[entry, other]))
