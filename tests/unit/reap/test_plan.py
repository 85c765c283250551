"""The plan of a reclaiming pass: the breaker, --max-reap, the re-check's reasons."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reaper.model import Attachment, AttachmentKey, NsKey, Verdict
from reaper.reap.plan import breaker_counts, breaker_trips


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
