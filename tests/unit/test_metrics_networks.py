"""The metrics of orphans by age and by network, and the bound on the network label's values."""

from __future__ import annotations

from pathlib import Path

from msgspec.structs import replace
from prometheus_client.parser import text_string_to_metric_families

from reaper.metrics import (
    MAX_NETWORK_LABELS,
    NO_NETWORK,
    ORPHAN_KINDS,
    OTHER_NETWORK,
    PREFIX,
    ReaperMetrics,
    write_textfile,
)
from reaper.model import Attachment, AttachmentKey, ReclaimOutcome, ResourceOutcome, ResourceRef, ScanReport, Verdict
from tests.harness.results import TAKEN_AT, full_report, reap_result
from tests.harness.snapshots import NET, cid

FAMILIES = ("network_orphans", "network_reclaimed_attachments", "network_del_errors")


def value(metrics: ReaperMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(PREFIX + name, labels)


def network_values(metrics: ReaperMetrics, family: str) -> set[str]:
    """The network label values the exposition has for a family."""
    text = metrics.exposition().decode()
    found = next(f for f in text_string_to_metric_families(text) if f.name == PREFIX + family)
    return {s.labels["network"] for s in found.samples if not s.name.endswith("_created")}


def orphan(n: int, network: str | None, *, verdict: Verdict = "orphan", age: float = 60.0) -> Attachment:
    key = AttachmentKey(cid(n), network, "eth0") if network is not None else AttachmentKey(None, None, None, f"/p{n}")
    return Attachment(
        key=key,
        resources=(ResourceRef(kind="netns", name=f"cni-{n}", created_at=TAKEN_AT - age),),
        netns=None,
        verdict=verdict,
        reason="gone",
        age_seconds=age,
    )


def report(attachments: tuple[Attachment, ...], networks: tuple[str, ...]) -> ScanReport:
    return replace(full_report(), attachments=attachments, networks=networks)


def outcome(n: int, network: str, *, ok: bool, del_errors: int = 0) -> ReclaimOutcome:
    freed = ResourceOutcome(kind="netns", name=f"cni-{n}", method="kernel", ok=ok, error=None if ok else "left")
    return ReclaimOutcome(AttachmentKey(cid(n), network, "eth0"), (freed,), ("DEL broke",) * del_errors)


# --- the oldest orphan of each kind ---------------------------------------------------------------


def test_the_oldest_orphan_of_each_kind_is_its_own_age_else_its_attachments() -> None:
    metrics = ReaperMetrics(mode="reap")
    metrics.observe_scan(full_report())
    # The orphan's lease was written 100s before the look; its veth has no timestamp, so it is as
    # old as its attachment (3601s). The live, pending and unknown attachments count for nothing.
    assert value(metrics, "oldest_orphan_age_seconds", kind="ipam") == 100.0
    assert value(metrics, "oldest_orphan_age_seconds", kind="veth") == 3601.0
    for kind in set(ORPHAN_KINDS) - {"ipam", "veth"}:
        assert value(metrics, "oldest_orphan_age_seconds", kind=kind) == 0
    # A held namespace is never an orphan the reaper frees: no series for it.
    assert "heldns" not in ORPHAN_KINDS
    assert value(metrics, "oldest_orphan_age_seconds", kind="heldns") is None


def test_the_oldest_orphan_age_is_the_largest_and_falls_to_zero_once_they_are_gone() -> None:
    metrics = ReaperMetrics(mode="reap")
    old = orphan(1, NET, age=90_000.0)
    metrics.observe_scan(report((orphan(2, NET, age=10.0), old, orphan(3, NET, verdict="live", age=1e6)), (NET,)))
    assert value(metrics, "oldest_orphan_age_seconds", kind="netns") == 90_000.0
    # A timestamp after the look (a clock set back, a file touched) is no age, not a negative one.
    future = replace(old, resources=(replace(old.resources[0], created_at=TAKEN_AT + 500),))
    metrics.observe_scan(report((future,), (NET,)))
    assert value(metrics, "oldest_orphan_age_seconds", kind="netns") == 0
    metrics.observe_scan(report((), (NET,)))
    assert value(metrics, "oldest_orphan_age_seconds", kind="netns") == 0


# --- orphans, reclaims and DEL errors by network ---------------------------------------------------


def test_orphans_are_counted_by_network_others_and_none_in_their_buckets() -> None:
    metrics = ReaperMetrics(mode="reap")
    attachments = (
        orphan(1, NET),
        orphan(2, NET),
        orphan(3, "cached-only"),  # a network only a cache entry names
        orphan(4, None),  # a lone netns pin
        orphan(5, "net2", verdict="live"),
    )
    metrics.observe_scan(report(attachments, (NET, "net2")))
    assert value(metrics, "network_orphans", network=NET) == 2
    assert value(metrics, "network_orphans", network=OTHER_NETWORK) == 1
    assert value(metrics, "network_orphans", network=NO_NETWORK) == 1
    # A network with no orphan has no series (absent reads as 0 to sums and alerts).
    assert network_values(metrics, "network_orphans") == {NET, OTHER_NETWORK, NO_NETWORK}


def test_a_network_gone_from_the_conf_dir_counts_as_other_and_its_gauge_goes() -> None:
    metrics = ReaperMetrics(mode="reap")
    metrics.observe_scan(report((orphan(1, "old"),), ("old",)))
    assert value(metrics, "network_orphans", network="old") == 1
    metrics.observe_scan(report((orphan(1, "old"),), ()))
    assert value(metrics, "network_orphans", network="old") is None
    assert value(metrics, "network_orphans", network=OTHER_NETWORK) == 1


def test_reclaims_and_del_errors_are_counted_by_network() -> None:
    metrics = ReaperMetrics(mode="reap")
    result = reap_result(
        report=report((orphan(9, "quiet", verdict="pending"),), (NET, "quiet", "never")),
        reclaimed=(
            outcome(1, NET, ok=True),
            outcome(2, NET, ok=True, del_errors=1),
            outcome(3, NET, ok=False, del_errors=2),
            outcome(4, "cached-only", ok=True),
        ),
    )
    metrics.observe_reap(result)
    assert value(metrics, "network_reclaimed_attachments_total", network=NET) == 2, "freed whole only"
    assert value(metrics, "network_del_errors_total", network=NET) == 3
    assert value(metrics, "network_reclaimed_attachments_total", network=OTHER_NETWORK) == 1
    # A network with an attachment that may come to be reclaimed is there at 0, so that
    # increase() sees its first count; one with none has no series.
    assert value(metrics, "network_reclaimed_attachments_total", network="quiet") == 0
    assert value(metrics, "network_del_errors_total", network="quiet") == 0
    assert value(metrics, "network_reclaimed_attachments_total", network="never") is None
    assert value(metrics, "plugin_del_errors_total") == 3, "the total stays what it was"
    metrics.observe_reap(result)
    assert value(metrics, "network_reclaimed_attachments_total", network=NET) == 4, "counters add up"


def test_no_network_series_before_a_network_has_something_to_reclaim() -> None:
    for mode in ("scan", "reap"):
        metrics = ReaperMetrics(mode=mode)
        metrics.observe_scan(report((orphan(1, NET, verdict="live"),), (NET,)))
        for family in FAMILIES:
            assert network_values(metrics, family) == set(), (mode, family)
    # In scan mode nothing is reclaimed: an orphan gives its network no reclaim counters.
    scan = ReaperMetrics(mode="scan")
    scan.observe_scan(report((orphan(1, NET),), (NET,)))
    assert network_values(scan, "network_reclaimed_attachments") == set()
    assert network_values(scan, "network_orphans") == {NET}


# --- hostile input: the label values stay bounded ------------------------------------------------


def test_thousands_of_networks_make_at_most_the_cap_of_label_values() -> None:
    """A writer of the conf dir and /var/lib/cni makes a new network for every orphan, pass after
    pass: each network metric keeps at most MAX_NETWORK_LABELS names and the two buckets."""
    metrics = ReaperMetrics(mode="reap")
    limit = MAX_NETWORK_LABELS + 2
    for pass_no in range(5):
        names = tuple(f"p{pass_no}-n{i:05d}" for i in range(2_000))
        attachments = tuple(orphan(i, name) for i, name in enumerate(names))
        outcomes = tuple(outcome(i, name, ok=True, del_errors=1) for i, name in enumerate(names[:500]))
        metrics.observe_reap(reap_result(report=report(attachments, names), reclaimed=outcomes, skipped=()))
        for family in FAMILIES:
            assert len(network_values(metrics, family)) <= limit, family
    # The first pass's first names in name order kept their places; everything else is "other".
    assert value(metrics, "network_orphans", network="p0-n00000") is None, "gone from the conf dir"
    assert value(metrics, "network_reclaimed_attachments_total", network="p0-n00000") == 1
    assert value(metrics, "network_orphans", network=OTHER_NETWORK) == 2_000
    assert value(metrics, "network_reclaimed_attachments_total", network=OTHER_NETWORK) == 5 * 500 - MAX_NETWORK_LABELS
    total = sum(value(metrics, "network_orphans", network=n) or 0 for n in network_values(metrics, "network_orphans"))
    assert total == 2_000, "every orphan is counted once, under its name or a bucket"


def test_a_network_name_given_out_keeps_its_place_and_a_later_one_waits_for_none() -> None:
    metrics = ReaperMetrics(mode="reap")
    first = tuple(f"a{i:02d}" for i in range(MAX_NETWORK_LABELS))
    metrics.observe_scan(report((), first))
    # The node's real network, defined later, finds the cap taken: it counts under "other".
    metrics.observe_scan(report((orphan(1, "real"), orphan(2, "a00")), ("real", *first)))
    assert value(metrics, "network_orphans", network="real") is None
    assert value(metrics, "network_orphans", network=OTHER_NETWORK) == 1
    assert value(metrics, "network_orphans", network="a00") == 1


def test_conf_network_names_that_are_not_cni_names_are_never_label_values() -> None:
    metrics = ReaperMetrics(mode="reap")
    bad = ("", "_other", "-x", "a b", "x" * 2000, 'quote"')
    metrics.observe_scan(report(tuple(orphan(i, n) for i, n in enumerate(bad, start=1) if n), bad))
    assert network_values(metrics, "network_orphans") == {OTHER_NETWORK}
    assert value(metrics, "network_orphans", network=OTHER_NETWORK) == len(bad) - 1


# --- the one-shot runs' textfile -----------------------------------------------------------------


def test_a_one_shot_textfile_has_the_new_metrics_of_that_run(tmp_path: Path) -> None:
    """`reaper reap --textfile` observes one pass into a fresh registry: its counters count that
    run, its gauges say what the run saw."""
    metrics = ReaperMetrics(mode="reap")
    metrics.observe_reap(
        reap_result(report=replace(full_report(), networks=(NET,)), reclaimed=(outcome(1, NET, ok=True, del_errors=1),))
    )
    target = tmp_path / "reaper.prom"
    write_textfile(str(target), metrics.exposition())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(target.read_text())
        for s in family.samples
    }
    assert samples[(PREFIX + "network_orphans", (("network", NET),))] == 1
    assert samples[(PREFIX + "network_reclaimed_attachments_total", (("network", NET),))] == 1
    assert samples[(PREFIX + "network_del_errors_total", (("network", NET),))] == 1
    assert samples[(PREFIX + "oldest_orphan_age_seconds", (("kind", "veth"),))] == 3601.0
