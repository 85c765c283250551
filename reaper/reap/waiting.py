"""Orphans the reaper can do nothing for: verdict `waiting`. Pure: no I/O.

Only the files a DEL needs are left, their chain keeps state only that DEL frees, and no DEL can
run (reaper.reap.requests.waits_for_plugin): kept for good and reported apart from the leaks.
Why: docs/design.md, "Orphans that wait".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgspec.structs import replace

from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import NodeSnapshot, ScanReport
from reaper.reap.requests import could_wait, index, orphan_trust, stateful_chain, waits_for_plugin


def mark_waiting(
    report: ScanReport,
    snapshot: NodeSnapshot,
    *,
    allow_plugins: Sequence[str] = (),
    plugins_run: bool = True,
    gone_here: Mapping[str, tuple[str, str]] | None = None,
    registry: Registry = REGISTRY,
) -> ScanReport:
    """The report with each orphan no pass can do anything for as `waiting`, with why.
    `plugins_run`: False with --method kernel; `gone_here`: sandboxes a runtime of this node
    listed to this process and lists no more (reaper.runtime.listed)."""
    orphans = [a for a in report.attachments if a.verdict == "orphan"]
    if not any(could_wait(a, registry) for a in orphans):
        return report  # every orphan holds a namespace or more than a DEL needs: none waits
    records = index(snapshot, registry)
    configs = snapshot.configs
    trust = orphan_trust(snapshot, records, orphans, allow_plugins, gone_here=gone_here, registry=registry)
    plugin_trust = trust if plugins_run else None
    changed = False
    attachments = []
    for a in report.attachments:
        why = waits_for_plugin(a, records, configs, plugin_trust, registry) if a.verdict == "orphan" else None
        if why is None:
            attachments.append(a)
            continue
        chain = stateful_chain(a, records, configs, None)
        plugins = tuple(chain) if isinstance(chain, list) else ()
        attachments.append(replace(a, verdict="waiting", reason=why, waits_for=plugins))
        changed = True
    return replace(report, attachments=tuple(attachments)) if changed else report
