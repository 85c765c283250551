"""explain: which attachments a target names, and how the evidence reads."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from reaper.explain import TARGETS, Evidence, explain, explain_json, explain_text, matches, target_problem
from reaper.model import Attachment, AttachmentKey, NsKey, Policy, ResourceRef, ScanResult
from reaper.reap.trust import NO_KERNEL_EVIDENCE
from tests.harness.passes import confirmed
from tests.harness.snapshots import cache, cid, lease, snapshot

CID = "3f2a9c" + "0" * 58


def attachment(**changes: object) -> Attachment:
    base = Attachment(
        key=AttachmentKey(CID, "mynet", "eth0"),
        resources=(
            ResourceRef(kind="ipam", name="mynet/10.22.0.7", created_at=1.0, details={"network": "mynet"}),
            ResourceRef(kind="veth", name="veth3c1f2a7b", created_at=None, details={}),
            ResourceRef(kind="netns", name="cni-1234", created_at=1.0, details={"path": "/var/run/netns/cni-1234"}),
            ResourceRef(kind="firewall", name="rule", created_at=None, details={"ip": "fd00::7"}),
        ),
        netns=NsKey(4, 99),
        verdict="orphan",
        reason="no sandbox and no process own it, on 2 consecutive passes",
        age_seconds=3600.0,
        pod="kube-system/coredns-0",
    )
    return replace(base, **changes)


@pytest.mark.parametrize(
    "target",
    ["3f2a9c", CID, "kube-system/coredns-0", "10.22.0.7", "10.22.0.7/24", "mynet/10.22.0.7", "veth3c1f2a7b", "cni-1234",
     "/var/run/netns/cni-1234", "fd00:0:0:0:0:0:0:7", "FD00::7"],
)  # fmt: skip
def test_a_target_names_an_attachment_by_any_of_its_names(target: str) -> None:
    assert matches(attachment(), target)


@pytest.mark.parametrize(
    "target", ["3f", "3f2a9d", "kube-system/coredns", "10.22.0.70", "veth", "cni", "mynet", "mynet-x"]
)
def test_what_is_not_one_of_its_names_names_nothing(target: str) -> None:
    assert not matches(attachment(), target)


def evidence() -> Evidence:
    return Evidence(
        attachment=attachment(),
        runtimes=("containerd 2.2 at unix:///run/containerd/containerd.sock (known socket) listed 3 sandboxes",),
        namespace=("netns 4:99", "no process is inside it"),
        history="first seen 1h ago; ownerless on 1 consecutive earlier passes (--confirmations 2)",
        reclaim=("DEL with the config from /cache/x: network mynet (cniVersion 1.0.0): bridge, portmap",),
    )


def test_the_text_names_each_resource_and_each_piece_of_evidence() -> None:
    text = explain_text("3f2a9c", [evidence()])
    assert text.splitlines()[0] == f"attachment {CID}/mynet/eth0 (pod kube-system/coredns-0)"
    for line in ("verdict: ORPHAN", "ipam mynet/10.22.0.7 (network=mynet)", "no process is inside it",
                 "ownerless on 1 consecutive", "DEL with the config from /cache/x"):  # fmt: skip
        assert line in text
    assert explain_text("nope", []) == "nothing on this node matches 'nope'"


def test_the_json_is_the_reports_attachment_with_its_evidence() -> None:
    doc = explain_json("3f2a9c", [evidence()], now=3601.0)
    (one,) = doc["attachments"]
    assert one["container_id"] == CID and one["verdict"] == "orphan" and one["pod"] == "kube-system/coredns-0"
    assert one["evidence"]["namespace"] == ["netns 4:99", "no process is inside it"]
    assert one["resources"][0]["age_seconds"] == 3600.0


def test_why_no_plugin_would_run_is_said_once() -> None:
    """Issue 35: the reclaim line read "no plugin would run: no plugin runs: ..."."""
    snap = snapshot(leases=(lease(1),), caches=(cache(1, with_netns=False),))
    report = confirmed(snap, Policy(min_age=0.0, confirmations=1, stuck_after=900.0), snap.taken_at)
    result = ScanResult(
        report=report, snapshot=snap, known_netns={}, state_saved=False, warnings=(), seconds=0.0, timings=()
    )
    (found,) = explain(result, cid(1)[:8], {}, 1)
    (line, *_) = found.reclaim
    assert line == f"no plugin would run: {NO_KERNEL_EVIDENCE.removeprefix('no plugin runs: ')}; " + (
        "the kernel step frees what the kernel and files hold"
    )


@pytest.mark.parametrize("target", ["", " ", "12", "ab", "/"])
def test_a_target_too_short_to_name_anything_is_a_usage_error(target: str) -> None:
    """Issue 35: `reaper explain ''` and `explain 12` said "nothing matches" (exit 1)."""
    problem = target_problem(target)
    assert problem is not None and problem.endswith(TARGETS)


@pytest.mark.parametrize("target", ["3f2", "a/b", "::1", "veth3c1f2a7b", "10.0.0.7"])
def test_a_target_that_can_name_something_is_taken(target: str) -> None:
    assert target_problem(target) is None
