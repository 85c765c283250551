"""A plan written for review (`reap --dry-run --plan-out`), and a pass that acts only on what
was reviewed (`reap --plan`): the orphans it names that are orphans now, by the same key, with
the same resources and steps; the rest skipped with why. A plan file can only narrow a pass
(docs/design.md, "The plan a pass makes").
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping, Sequence
from typing import Annotated

import msgspec
from msgspec import Meta, Struct
from msgspec.structs import asdict

from reaper.model import Attachment, AttachmentKey, PlannedAttachment, SkippedAttachment

FORMAT = "cni-reaper-plan/1"
MAX_PLAN_BYTES = 16 * 1024 * 1024
MAX_ATTACHMENTS = 100_000
BOOT_ID = "/proc/sys/kernel/random/boot_id"

Text = Annotated[str, Meta(max_length=4096)]


class PlanError(ValueError):
    """A plan file that cannot be acted on; the message is one line for the operator."""


class ReviewedStep(Struct, frozen=True, forbid_unknown_fields=True, order=True):
    kind: Text
    name: Text
    method: Text


class ReviewedAttachment(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    container_id: Text | None
    network: Text | None
    ifname: Text | None
    pin: Text | None
    pod: Text | None = None  # for the reviewer; not compared
    resources: Annotated[list[Text], Meta(max_length=10_000)]  # each resource's identity, as JSON
    config_source: Text | None
    steps: Annotated[list[ReviewedStep], Meta(max_length=10_000)]

    @property
    def key(self) -> AttachmentKey:
        return AttachmentKey(self.container_id, self.network, self.ifname, self.pin)


class PlanFile(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    format: Text
    node: Text
    boot_id: Text
    made_at: float
    attachments: Annotated[list[ReviewedAttachment], Meta(max_length=MAX_ATTACHMENTS)]


class NodeIdentity(Struct, frozen=True):
    """Which node, and which boot of it, a plan was made on."""

    name: str
    boot_id: str


def this_node() -> NodeIdentity:
    try:
        with open(BOOT_ID, encoding="ascii", errors="replace") as f:
            boot_id = f.read(64).strip()
    except OSError:
        boot_id = ""
    return NodeIdentity(socket.gethostname(), boot_id)


def identities(attachment: Attachment) -> list[str]:
    """Each resource's identity (what a later look finds it by), as JSON text, sorted."""
    return sorted(msgspec.json.encode(ref.identity).decode() for ref in attachment.resources)


def _reviewed_steps(planned: PlannedAttachment) -> list[ReviewedStep]:
    return [ReviewedStep(s.kind, s.name, s.method) for s in planned.steps]


def plan_document(
    plan: Sequence[PlannedAttachment], attachments: Sequence[Attachment], node: NodeIdentity, now: float
) -> bytes:
    """The plan file for `plan`, whose attachments are among `attachments`."""
    by_key = {a.key: a for a in attachments}
    reviewed = [
        ReviewedAttachment(
            **asdict(p.key),
            pod=by_key[p.key].pod,
            resources=identities(by_key[p.key]),
            config_source=p.config_source,
            steps=_reviewed_steps(p),
        )
        for p in plan
        if p.key in by_key
    ]
    doc = PlanFile(format=FORMAT, node=node.name, boot_id=node.boot_id, made_at=now, attachments=reviewed)
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"


def read_plan(path: str, node: NodeIdentity) -> PlanFile:
    """The plan file at `path`, made on this node since its last boot; else PlanError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise PlanError(f"--plan {path}: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PlanError(f"--plan {path}: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_PLAN_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError(f"--plan {path}: larger than {MAX_PLAN_BYTES // (1024 * 1024)} MiB")
    try:
        plan = msgspec.json.decode(data, type=PlanFile)
    except msgspec.ValidationError as err:
        raise PlanError(f"--plan {path}: not a plan `reaper reap --dry-run --plan-out` wrote: {err}") from None
    except msgspec.DecodeError:
        raise PlanError(f"--plan {path}: not JSON") from None
    if plan.format != FORMAT:
        raise PlanError(f"--plan {path}: format {plan.format[:40]!r}, this reaper reads {FORMAT!r}")
    if plan.node != node.name:
        raise PlanError(f"--plan {path}: made on node {plan.node[:80]!r}, this is {node.name!r}")
    if not node.boot_id or plan.boot_id != node.boot_id:
        raise PlanError(f"--plan {path}: made before this node's last boot: make a new plan")
    return plan


def reviewed_orphans(
    orphans: Sequence[Attachment], attachments: Sequence[Attachment], plan: PlanFile
) -> tuple[list[Attachment], list[SkippedAttachment]]:
    """The orphans the plan reviewed as they are now (same key, same resources), and the rest
    skipped with why, planned attachments that are not orphans now included."""
    reviewed = plan_keys(plan)
    now = {a.key: a for a in attachments}
    kept: list[Attachment] = []
    skipped: list[SkippedAttachment] = []
    for orphan in orphans:
        entry = reviewed.get(orphan.key)
        if entry is None:
            skipped.append(SkippedAttachment(orphan.key, "not in the reviewed plan"))
            continue
        changed = _resources_changed(entry.resources, identities(orphan))
        if changed is not None:
            skipped.append(SkippedAttachment(orphan.key, f"its resources changed since the plan: {changed}"))
            continue
        kept.append(orphan)
    orphan_keys = {o.key for o in orphans}
    for key in (key for key in reviewed if key not in orphan_keys):
        seen = now.get(key)
        why = f"{seen.verdict} now: {seen.reason}" if seen is not None else "gone now"
        skipped.append(SkippedAttachment(key, f"in the reviewed plan, but {why}"))
    return kept, skipped


def _resources_changed(planned: Sequence[str], now: Sequence[str]) -> str | None:
    added, gone = sorted(set(now) - set(planned)), sorted(set(planned) - set(now))
    if not added and not gone:
        return None
    parts = [f"{len(added)} new ({added[0][:120]}{', ...' if len(added) > 1 else ''})"] if added else []
    parts += [f"{len(gone)} gone ({gone[0][:120]}{', ...' if len(gone) > 1 else ''})"] if gone else []
    return "; ".join(parts)


def steps_changed(planned: PlannedAttachment, reviewed: Mapping[AttachmentKey, ReviewedAttachment]) -> str | None:
    """Why `planned` is not what the plan (`reviewed`: plan_keys) reviewed for its key, or None."""
    entry = reviewed.get(planned.key)
    if entry is None:
        return "not in the reviewed plan"
    if entry.config_source != planned.config_source:
        return (
            f"DEL would take its config from {planned.config_source or 'nowhere (kernel only)'}, "
            f"the plan said {entry.config_source or 'nowhere (kernel only)'}"
        )
    if sorted(entry.steps) != sorted(_reviewed_steps(planned)):
        return "its steps or their methods differ from the plan's"
    return None


def plan_keys(plan: PlanFile) -> Mapping[AttachmentKey, ReviewedAttachment]:
    return {r.key: r for r in plan.attachments}
