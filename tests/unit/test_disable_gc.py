"""`disableGC: true` in a network config list: its attachments are never reclaimed.

The CNI spec's switch for a config several runtimes share (SPEC.md: "runtimes must not call GC
for this network configuration list"); libcni's GCNetworkList returns before any of its DELs
when it is set (containernetworking/cni libcni/api.go). Judged here with the real parser.
"""

from __future__ import annotations

import json

import pytest
from msgspec.structs import replace

from reaper.doctor import _gc_disabled
from reaper.exclusions import Exclusions
from reaper.kinds.netconf import parse_network_config
from reaper.model import NetworkConfig, Policy
from reaper.reap.plan import breaker_counts
from reaper.reconcile import reconcile
from tests.harness.snapshots import NET, cache, cid, lease, runtime, sandbox, snapshot

NOW = 10_000.0
OLD = NOW - 3600.0
POLICY = Policy(600.0, 1, 900.0)


def _conflist(name: str, **top: object) -> NetworkConfig:
    doc = {"cniVersion": "1.1.0", "name": name, **top, "plugins": [{"type": "bridge"}]}
    return parse_network_config(json.dumps(doc).encode(), f"/etc/cni/net.d/10-{name}.conflist")


@pytest.mark.parametrize(
    ("value", "disabled"),
    [
        (True, True),
        (False, False),
        # libcni's readBool (libcni/conf.go) also takes the strings, in any case
        ("true", True),
        ("TRUE", True),
        ("False", False),
        # a value libcni refuses: no runtime loads that list, and the reaper keeps its hands off
        ("yes", True),
        (1, True),
    ],
)
def test_disable_gc_is_read_as_libcni_reads_it(value: object, disabled: bool) -> None:
    assert _conflist("n", disableGC=value).disable_gc is disabled
    assert _conflist("n").disable_gc is False


def test_a_network_whose_config_says_disable_gc_is_excluded_with_that_reason() -> None:
    snap = replace(
        snapshot(
            leases=(lease(1, OLD), lease(2, OLD, net="other")),
            caches=(cache(1, OLD, with_netns=False), cache(2, OLD, with_netns=False, net="other")),
        ),
        configs=(_conflist(NET, disableGC=True), _conflist("other")),
    )
    report, history = reconcile(snap, runtime(), {}, POLICY, NOW)
    verdicts = {a.key.container_id: a for a in report.attachments}
    kept, freed = verdicts[cid(1)], verdicts[cid(2)]
    assert freed.verdict == "orphan"
    assert kept.verdict == "excluded"
    assert "disableGC" in kept.reason and f"/etc/cni/net.d/10-{NET}.conflist" in kept.reason
    assert "else orphan" in kept.reason
    assert history[kept.key.as_text()].orphan_streak == 0, "counted afresh once the config changes"
    # As --exclude-network: a kept network does not weigh in the breaker.
    assert breaker_counts(report.attachments) == breaker_counts((freed,))


def test_the_operators_exclusions_do_not_undo_disable_gc() -> None:
    snap = replace(
        snapshot(leases=(lease(1, OLD),), caches=(cache(1, OLD, with_netns=False),)),
        configs=(_conflist(NET, disableGC="true"),),
    )
    policy = replace(POLICY, exclusions=Exclusions(namespaces=("nothing-*",)))
    report, _ = reconcile(snap, runtime(), {}, policy, NOW)
    assert [a.verdict for a in report.attachments] == ["excluded"]


def test_a_network_whose_config_is_gone_is_judged_by_its_cached_config() -> None:
    """The conf file removed, the cache entry's own config (what its DEL would run) still says
    disableGC: kept, as the admin wrote it when the pod was added."""
    cached = replace(_conflist(NET, disableGC=True), path=f"cache:/var/lib/cni/results/{NET}-{cid(1)}-eth0")
    snap = replace(snapshot(leases=(lease(1, OLD),), caches=(cache(1, OLD, with_netns=False),)), configs=(cached,))
    report, _ = reconcile(snap, runtime(), {}, POLICY, NOW)
    assert [a.verdict for a in report.attachments] == ["excluded"]


def test_the_conf_dirs_config_decides_over_a_cached_one() -> None:
    """A cache entry's config is what the network was when the pod was added; the conf dir's is
    the network now. Only a network no conf dir has is judged by a cached config."""
    cached = replace(_conflist(NET, disableGC=True), path=f"cache:/var/lib/cni/results/{NET}-{cid(1)}-eth0")
    snap = replace(
        snapshot(leases=(lease(1, OLD),), caches=(cache(1, OLD, with_netns=False),)),
        configs=(_conflist(NET), cached),
    )
    report, _ = reconcile(snap, runtime(), {}, POLICY, NOW)
    assert [a.verdict for a in report.attachments] == ["orphan"]


def test_a_live_attachment_on_such_a_network_stays_live() -> None:
    snap = replace(
        snapshot(leases=(lease(1, OLD),), caches=(cache(1, OLD),)), configs=(_conflist(NET, disableGC=True),)
    )
    report, _ = reconcile(snap, runtime(sandbox(1)), {}, POLICY, NOW)
    assert [a.verdict for a in report.attachments] == ["live"]


def test_doctor_names_each_network_whose_config_says_disable_gc() -> None:
    checks = list(_gc_disabled([_conflist("shared", disableGC=True), _conflist("plain")]))
    assert [(c.name, c.status) for c in checks] == [("disableGC", "warn")]
    assert "shared" in checks[0].message and "/etc/cni/net.d/10-shared.conflist" in checks[0].message
    assert "plain" not in checks[0].message
    assert list(_gc_disabled([_conflist("plain")])) == []
