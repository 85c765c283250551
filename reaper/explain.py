"""`reaper explain TARGET`: the attachments a target names (TARGETS), their verdict, and the
evidence the pass weighed: what each runtime listed, who owns and is inside the namespace, what
earlier passes counted, and what a reclaim would run, planned as a pass plans it. Read-only:
the look counts no pass of its own."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from msgspec import Struct

from reaper.durations import format_duration
from reaper.kinds.netconf import plugin_list
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import Attachment, AttachmentHistory, Holder, NsKey, PlannedAttachment, ScanResult
from reaper.reap.plan import costs_nothing
from reaper.reap.requests import index, orphan_trust, plan_orphan, waits_for_plugin
from reaper.report import attachment_json, runtime_lines

_HEX_PREFIX = re.compile(r"[0-9a-f]{3,64}")
# The shortest target that names anything: a 3-digit ID prefix (fewer names much of the node), `a/b`, `::1`.
MIN_TARGET = 3
TARGETS = (
    "give a container ID or a prefix of one (3+ hex digits), a pod NAMESPACE/NAME, an IP address, "
    "or the name or path of a resource (veth, pin, lease, chain, cache file)"
)


def target_problem(target: str) -> str | None:
    """Why `target` cannot name anything (a usage error, not "nothing matches"), or None."""
    if not target.strip():
        return f"explain: TARGET is empty: {TARGETS}"
    if len(target) < MIN_TARGET:
        return f"explain: TARGET {target!r} is too short to name anything: {TARGETS}"
    return None


class Evidence(Struct, frozen=True, kw_only=True):
    """What one attachment's verdict rests on, each item one line for a person."""

    attachment: Attachment
    runtimes: tuple[str, ...]  # what each runtime said, and whether one lists this container
    namespace: tuple[str, ...]  # its netns: whose, and who is inside
    history: str  # what earlier passes counted (the state file)
    reclaim: tuple[str, ...]  # what a reclaim would run, or why nothing would
    # The plan a pass would make for it (plan_orphan); None for live, unknown, excluded, waiting.
    planned: PlannedAttachment | None = None


def _address(text: str) -> str | None:
    """The address in `text`: bare, `10.0.0.7/24`, or a lease's `<network>/10.0.0.7`; else None."""
    first, _, rest = text.partition("/")
    for candidate in (first, rest):
        try:
            return str(ipaddress.ip_address(candidate))
        except ValueError:
            continue
    return None


def matches(attachment: Attachment, target: str) -> bool:
    """Whether `target` names the attachment (TARGETS)."""
    cid = attachment.key.container_id
    if cid is not None and _HEX_PREFIX.fullmatch(target) and cid.startswith(target):
        return True
    if attachment.pod == target:
        return True
    wanted = _address(target)
    for ref in attachment.resources:
        path = ref.details.get("path")
        if target == ref.name or (isinstance(path, str) and target in (path, os.path.basename(path))):
            return True
        # An address in its name or a detail (a rule's ip); a network name, which every
        # attachment on it carries, names none.
        if wanted is not None:
            said = [ref.name, *(v for v in ref.details.values() if isinstance(v, str))]
            if any(_address(value) == wanted for value in said):
                return True
    return False


def _runtimes(result: ScanResult, attachment: Attachment) -> tuple[str, ...]:
    view = result.report.runtime
    lines = runtime_lines(view)
    if not view.reachable:
        return tuple(lines)
    cid = attachment.key.container_id
    listed = next((s for s in view.sandboxes if cid is not None and s.id == cid), None)
    if listed is not None:
        state = "READY" if listed.ready else "NOTREADY"
        lines.append(f"sandbox {listed.id[:12]} ({listed.namespace}/{listed.name}) is listed, {state}")
    elif cid is not None:
        lines.append(f"no runtime lists a sandbox {cid[:12]}")
    return tuple(lines)


def _holders(holders: Iterable[Holder]) -> str:
    described = [f"pid {h.pid} ({h.comm}{', a CNI plugin' if h.is_cni_plugin else ''})" for h in holders]
    return ", ".join(described[:10]) + (f" and {len(described) - 10} more" if len(described) > 10 else "")


def _namespace(result: ScanResult, attachment: Attachment) -> tuple[str, ...]:
    netns = attachment.netns
    if netns is None:
        return ("no network namespace: nothing of it is in the kernel but what its resources name",)
    lines = [f"netns {netns.dev}:{netns.ino}"]
    if netns == result.snapshot.host_netns:
        lines.append("it is the host's network namespace")
    owner = next((s for s in result.report.runtime.sandboxes if s.netns == netns), None)
    if owner is not None:
        lines.append(f"sandbox {owner.id[:12]} ({owner.namespace}/{owner.name}) has it as its netns")
    holders: Mapping[NsKey, tuple[Holder, ...]] = dict(result.snapshot.netns_holders)
    pids = dict(result.snapshot.netns_pids)
    if holders.get(netns):
        lines.append(f"inside it: {_holders(holders[netns])}")
    elif pids.get(netns):
        lines.append(f"inside it: pids {', '.join(str(p) for p in pids[netns][:10])}")
    elif result.snapshot.unseen_processes is not None:
        lines.append(f"who is inside is unknown: {result.snapshot.unseen_processes}")
    else:
        lines.append("no process is inside it")
    return tuple(lines)


def _history(previous: AttachmentHistory | None, confirmations: int, now: float) -> str:
    if previous is None:
        return "no earlier pass counted it (a new attachment, or a new state file)"
    since = format_duration(max(0.0, now - previous.first_seen))
    # When the count last rose: a pass within half of --interval of it does not raise it again.
    counted = (
        f", the last counted {format_duration(max(0.0, now - previous.counted_at))} ago"
        if previous.counted_at is not None and previous.orphan_streak
        else ""
    )
    return (
        f"first seen {since} ago; ownerless on {previous.orphan_streak} consecutive earlier passes "
        f"(--confirmations {confirmations}){counted}"
    )


def _plugins(config: bytes) -> str:
    try:
        name, version, plugins = plugin_list(config)
    except ValueError:
        return "a config that does not read as a network list"
    types = ", ".join(str(p.get("type")) for p in plugins)
    return f"network {name} (cniVersion {version}): {types}"


def _reclaim(
    attachment: Attachment,
    records: Mapping[Any, Any],
    result: ScanResult,
    allow_plugins: Sequence[str],
    *,
    kernel_only: bool,
    quarantine: bool,
    registry: Registry,
) -> tuple[tuple[str, ...], PlannedAttachment | None]:
    """What a reclaim would run, decided as a pass decides it: orphan_trust over the look's
    orphans and waiting attachments (a pending one counted as an orphan), then plan_orphan."""
    if attachment.verdict in ("live", "unknown", "excluded"):
        return (f"nothing: it is {attachment.verdict}",), None
    configs = result.snapshot.configs
    orphans = [a for a in result.report.attachments if a.verdict == "orphan" or a.key == attachment.key]
    waiting = [a for a in result.report.attachments if a.verdict == "waiting" and a.key != attachment.key]
    trust = orphan_trust(
        result.snapshot, records, orphans, allow_plugins, waiting=waiting, gone_here=result.gone_here, registry=registry
    )
    waits = waits_for_plugin(attachment, records, configs, None if kernel_only else trust, registry)
    if waits is not None:
        return (f"nothing this pass: {waits}",), None
    costless = costs_nothing(attachment, records)
    one = plan_orphan(
        attachment, records, configs, trust, kernel_only=kernel_only, quarantine=quarantine, costless=costless,
        registry=registry,
    )  # fmt: skip
    lines = []
    if one.request is not None:
        lines.append(f"DEL with the config from {one.request.source}: {_plugins(one.request.config)}")
        lines.append(f"CNI_NETNS={one.request.netns or '(none)'}, then the kernel step for what DEL leaves")
    else:
        # A note begins "no plugin runs: "; a pin alone has none: no cache entry names a DEL for it.
        why = one.planned.config_note or _no_request_because(kernel_only=kernel_only, costless=costless)
        why = why.removeprefix("no plugin runs: ")
        lines.append(f"no plugin would run: {why}; the kernel step frees what the kernel and files hold")
    if one.keep is not None:
        lines.append(f"kept until a DEL succeeds: {one.keep}")
    return tuple(lines), one.planned


def _no_request_because(*, kernel_only: bool, costless: bool) -> str:
    """Why a pass plans no DEL for an attachment whose plan carries no note of its own."""
    if kernel_only:
        return "--method kernel"
    if costless:
        return "files alone in no namespace that cost nothing: no DEL runs for them"
    return "no cache entry names its container and network"


def explain(
    result: ScanResult,
    target: str,
    history: Mapping[str, AttachmentHistory],
    confirmations: int,
    allow_plugins: Sequence[str] = (),
    *,
    kernel_only: bool = False,
    quarantine: bool = False,
    registry: Registry = REGISTRY,
) -> list[Evidence]:
    """The evidence for every attachment `target` names; `history`: the state file before this
    look; `allow_plugins`, `kernel_only` and `quarantine`: the reap settings a pass plans with."""
    records = index(result.snapshot, registry)
    now = result.report.taken_at
    found = []
    for a in result.report.attachments:
        if not matches(a, target):
            continue
        reclaim, planned = _reclaim(
            a, records, result, allow_plugins, kernel_only=kernel_only, quarantine=quarantine, registry=registry
        )
        found.append(
            Evidence(
                attachment=a,
                runtimes=_runtimes(result, a),
                namespace=_namespace(result, a),
                history=_history(history.get(a.key.as_text()), confirmations, now),
                reclaim=reclaim,
                planned=planned,
            )
        )
    return found


def explain_json(target: str, found: Sequence[Evidence], now: float) -> dict[str, Any]:
    return {
        "target": target,
        "attachments": [
            {
                **attachment_json(e.attachment, now),
                "evidence": {
                    "runtimes": list(e.runtimes),
                    "namespace": list(e.namespace),
                    "history": e.history,
                    "reclaim": list(e.reclaim),
                },
            }
            for e in found
        ],
    }


def explain_text(target: str, found: Sequence[Evidence]) -> str:
    if not found:
        return f"nothing on this node matches {target!r}"
    lines: list[str] = []
    for e in found:
        a = e.attachment
        if lines:
            lines.append("")
        who = f" (pod {a.pod})" if a.pod else ""
        lines.append(f"attachment {a.key.as_text()}{who}")
        lines.append(f"  verdict: {a.verdict.upper()}: {a.reason}")
        lines.append(f"  age: {format_duration(a.age_seconds)}; owner by its cache entry: {a.owner}")
        lines.append("  resources:")
        for ref in a.resources:
            details = ", ".join(f"{k}={v}" for k, v in ref.details.items())
            lines.append(f"    {ref.kind} {ref.name}" + (f" ({details})" if details else ""))
        lines += ["  runtimes:", *(f"    {line}" for line in e.runtimes)]
        lines += ["  namespace:", *(f"    {line}" for line in e.namespace)]
        lines.append(f"  earlier passes: {e.history}")
        lines += ["  a reclaim would run:", *(f"    {line}" for line in e.reclaim)]
    return "\n".join(lines)
