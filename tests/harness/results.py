"""Scan reports and reap results with something in every field, for the report and metrics tests."""

from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from reaper.model import (
    Attachment,
    AttachmentKey,
    CorruptFile,
    ForeignPin,
    IpamRange,
    PlannedAttachment,
    PlannedStep,
    ReapResult,
    ReclaimOutcome,
    ResourceOutcome,
    ResourceRef,
    RuntimeAnswer,
    RuntimeView,
    ScanReport,
    SkippedAttachment,
    SourceError,
    StuckSandbox,
    UnconfirmedResource,
    Verdict,
)
from tests.harness.snapshots import NET, cid, runtime, sandbox

TAKEN_AT = 10_000.0
LONG_NAME = "cni-" + "ab" * 40  # longer than a table's column


def key(n: int, network: str = NET) -> AttachmentKey:
    return AttachmentKey(cid(n), network, "eth0")


def attachment(n: int, verdict: Verdict) -> Attachment:
    resources: tuple[ResourceRef, ...] = (
        ResourceRef(kind="ipam", name=f"10.0.0.{n}", created_at=TAKEN_AT - 100.0, details={"network": NET}),
        ResourceRef(kind="veth", name=LONG_NAME if n == 1 else f"veth{n:08x}", created_at=None),
    )
    if verdict == "waiting":  # only the files a DEL needs are left of it
        resources = (ResourceRef(kind="cache", name=f"{NET}-{cid(n)}-eth0", created_at=TAKEN_AT - 100.0),)
    return Attachment(
        key=key(n),
        resources=resources,
        netns=None,
        verdict=verdict,
        reason=f"reason of {n}",
        age_seconds=3600.0 + n,
        owner="cri",
        waits_for=("calico", "calico-ipam") if verdict == "waiting" else (),
    )


def runtime_answers(*, reachable: bool) -> RuntimeView:
    answers: tuple[RuntimeAnswer, ...] = (
        RuntimeAnswer(
            endpoint="unix:///run/containerd.sock",
            source="kubelet",
            name="containerd",
            version="1.7",
            reachable=True,
            error=None,
            sandboxes=3,
        ),
        RuntimeAnswer(
            endpoint="unix:///run/crio.sock",
            source="known path",
            name=None,
            version=None,
            reachable=False,
            error="no one listens",
            sandboxes=0,
            skipped=True,
        ),
    )
    if not reachable:
        answers += (
            RuntimeAnswer(
                endpoint="unix:///run/other.sock",
                source="flag",
                name=None,
                version=None,
                reachable=False,
                error="deadline exceeded",
                sandboxes=0,
            ),
        )
    view = runtime(sandbox(7), reachable=reachable)
    return RuntimeView(
        endpoint=view.endpoint,
        name=view.name,
        version=view.version,
        reachable=reachable,
        error=None if reachable else "deadline exceeded",
        sandboxes=view.sandboxes,
        runtimes=answers,
    )


def full_report(*, reachable: bool = True) -> ScanReport:
    """A report with an attachment of each verdict and an entry in every list."""
    every: tuple[Verdict, ...] = ("orphan", "pending", "unknown", "live", "excluded", "waiting")
    verdicts: tuple[Verdict, ...] = every if reachable else ("unknown",)
    return ScanReport(
        taken_at=TAKEN_AT,
        runtime=runtime_answers(reachable=reachable),
        attachments=tuple(attachment(n, v) for n, v in enumerate(verdicts, start=1)),
        stuck_sandboxes=(
            StuckSandbox(
                id=cid(9),
                name="stuck-pod",
                namespace="kube-system",
                age_seconds=7200.0,
                resources=(ResourceRef(kind="netns", name="cni-9", created_at=TAKEN_AT - 50),),
            ),
        ),
        corrupt=(CorruptFile("ipam", "/var/lib/cni/networks/mynet/10.0.0.99", "not an address", 2),),
        errors=(SourceError("iptables", "iptables-save: not found"),),
        ranges=(IpamRange(NET, "10.0.0.0/24", 254, 64), IpamRange("empty", "10.1.0.0/32", 0, 0)),
        foreign_pins=(ForeignPin("test", "/run/netns/test", 1),),
        unconfirmed=(
            UnconfirmedResource(
                ResourceRef(kind="iptables", name="CNI-deadbeef", created_at=None), "its key matches none"
            ),
        ),
    )


def reap_result(**changes: Any) -> ReapResult:
    """A pass that planned two orphans, freed one, failed part of the other and skipped a third."""
    plan = (
        PlannedAttachment(key(1), "/var/lib/cni/results/mynet-1", (PlannedStep("ipam", "10.0.0.1", "cni-del"),), None),
        PlannedAttachment(
            key(2), None, (PlannedStep("veth", LONG_NAME, "kernel"),), "no kernel object proves the attachment"
        ),
    )
    reclaimed = (
        ReclaimOutcome(
            key(1), (ResourceOutcome(kind="ipam", name="10.0.0.1", method="cni-del", ok=True, error=None),), ()
        ),
        ReclaimOutcome(
            key(2),
            (
                ResourceOutcome(kind="veth", name=LONG_NAME, method="kernel", ok=True, error=None),
                ResourceOutcome(
                    kind="cache", name="mynet-2", method="kernel", ok=False, error="kept: calico-ipam may keep state"
                ),
            ),
            ("calico: DEL broke (code 11)",),
            "calico-ipam",
        ),
    )
    skipped = (SkippedAttachment(key(3), "over --max-reap 2; next pass"),)
    base = ReapResult(
        report=full_report(),
        breaker_open=False,
        breaker_reason=None,
        plan=plan,
        reclaimed=reclaimed,
        skipped=skipped,
        recheck_error=None,
        timings=(("scan", 0.5), ("kernel", 0.25)),
    )
    return replace(base, **changes)
