"""Exclusions: what the operator keeps out of reach, matched and judged."""

from __future__ import annotations

import json

import pytest
from msgspec.structs import replace

from reaper.cli import build_parser
from reaper.exclusions import Exclusions
from reaper.kinds.cache import CacheEntry, parse_cache_file
from reaper.kinds.cache import _owner as pod_of
from reaper.model import Policy
from reaper.reap.plan import breaker_counts
from reaper.reconcile import reconcile
from reaper.settings import SettingsError, settings_from
from tests.harness.snapshots import cache, cid, lease, runtime, sandbox, snapshot

NOW = 10_000.0
OLD = NOW - 3600.0


def test_each_exclusion_matches_whole_names_by_glob() -> None:
    rules = Exclusions(namespaces=("kube-*",), pods=("monitoring/prom-?",), networks=("multus-*",))
    assert rules.reason(pod="kube-system/coredns-1", network="net1") is not None
    assert rules.reason(pod="monitoring/prom-0", network="net1") is not None
    assert rules.reason(pod="monitoring/prom-10", network="net1") is None, "? is one character"
    assert rules.reason(pod=None, network="multus-sriov") is not None
    assert rules.reason(pod="default/kube-x", network="net1") is None, "the namespace part only"
    assert rules.reason(pod="Kube-system/x", network="net1") is None, "case-sensitive, as Kubernetes names are"
    assert rules.reason(pod=None, network=None) is None
    assert not Exclusions() and rules


def with_pod(n: int, pod: str | None, with_netns: bool = False) -> CacheEntry:
    entry = cache(n, OLD, with_netns=with_netns)
    namespace, name = pod.split("/") if pod else (None, None)
    return replace(entry, pod_namespace=namespace, pod_name=name)


def test_an_excluded_attachment_is_never_an_orphan_and_its_count_starts_afresh() -> None:
    snap = snapshot(leases=(lease(1, OLD), lease(2, OLD)), caches=(with_pod(1, "kube-system/dns"), with_pod(2, "a/b")))
    policy = Policy(600.0, 1, 900.0, Exclusions(namespaces=("kube-system",)))
    report, history = reconcile(snap, runtime(), {}, policy, NOW)
    verdicts = {a.key.container_id: (a.verdict, a.pod) for a in report.attachments}
    assert verdicts == {cid(1): ("excluded", "kube-system/dns"), cid(2): ("orphan", "a/b")}
    excluded = next(a for a in report.attachments if a.verdict == "excluded")
    assert "--exclude-namespace kube-system" in excluded.reason and "else orphan" in excluded.reason
    assert history[excluded.key.as_text()].orphan_streak == 0
    # Once the exclusion goes, it is counted from the start: two passes with confirmations 2.
    freed = Policy(600.0, 2, 900.0)
    first, history = reconcile(snap, runtime(), history, freed, NOW + 60)
    assert {a.key.container_id: a.verdict for a in first.attachments}[cid(1)] == "pending"


def test_a_live_attachment_stays_live_whatever_matches_it() -> None:
    snap = snapshot(leases=(lease(1, OLD),), caches=(with_pod(1, "kube-system/dns"),))
    policy = Policy(600.0, 1, 900.0, Exclusions(namespaces=("*",)))
    report, _ = reconcile(snap, runtime(sandbox(1)), {}, policy, NOW)
    assert [a.verdict for a in report.attachments] == ["live"]


def test_excluded_attachments_do_not_weigh_in_the_breaker() -> None:
    snap = snapshot(caches=tuple(with_pod(n, f"ns{n}/p", with_netns=True) for n in range(1, 5)))
    report, _ = reconcile(snap, runtime(), {}, Policy(600.0, 1, 900.0, Exclusions(namespaces=("ns1", "ns2"))), NOW)
    assert sorted(a.verdict for a in report.attachments) == ["excluded", "excluded", "orphan", "orphan"]
    assert breaker_counts(report.attachments) == (2, 2), "kept pods would hide a wrong runtime list"


def _entry_doc(args: object) -> bytes:
    return json.dumps({
        "kind": "cniCacheV1", "containerId": cid(1), "config": "", "ifName": "eth0", "networkName": "net1",
        "cniArgs": args, "result": {"cniVersion": "1.0.0"},
    }).encode()  # fmt: skip


@pytest.mark.parametrize(
    ("args", "pod"),
    [
        ([["K8S_POD_NAMESPACE", "kube-system"], ["K8S_POD_NAME", "coredns-5d7-x"]], "kube-system/coredns-5d7-x"),
        ([["K8S_POD_NAMESPACE", "Kube-System"], ["K8S_POD_NAME", "x"]], None),  # not a Kubernetes name
        ([["K8S_POD_NAMESPACE", "a/b"], ["K8S_POD_NAME", "x"]], None),  # would read as another pod
        ([["K8S_POD_NAMESPACE", "ns"], ["K8S_POD_NAME", "x" * 254]], None),  # too long
        ([["K8S_POD_NAMESPACE", "ns"], ["K8S_POD_NAME", 7]], None),  # not a string
        ([["K8S_POD_NAMESPACE", "ns"]], None),  # no name
        ([["K8S_POD_NAME", "x"]], None),  # no namespace: not a CRI runtime's
        ("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=x", None),  # not libcni's list of pairs
    ],
)  # fmt: skip
def test_the_pod_is_read_from_cni_args_only_when_both_are_kubernetes_names(args: object, pod: str | None) -> None:
    doc = parse_cache_file(f"net1-{cid(1)}-eth0", _entry_doc(args), {"net1"}).doc
    _, namespace, name = pod_of(doc, legacy=False)
    assert (f"{namespace}/{name}" if namespace else None) == pod


def test_bad_exclusions_are_one_line_errors() -> None:
    parser = build_parser()
    for argv, says in (
        (["--exclude-pod", "coredns"], "is not NAMESPACE/NAME"),
        (["--exclude-pod", "a/b/c"], "is not NAMESPACE/NAME"),
        (["--exclude-namespace", "a/b"], "is not a name"),
    ):
        with pytest.raises(SettingsError, match=says):
            settings_from(parser.parse_args(["scan", *argv]), {})
    ok = settings_from(
        parser.parse_args(["scan", "--exclude-pod", "kube-system/coredns-*"]), {"REAPER_EXCLUDE_NETWORK": "a,b"}
    )
    assert ok.policy.exclusions == Exclusions(pods=("kube-system/coredns-*",), networks=("a", "b"))
