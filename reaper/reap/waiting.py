"""Orphans the reaper can do nothing for: verdict `waiting`. Pure: no I/O.

All that is left of such an orphan are the files a plugin's DEL needs (its cache entry,
flannel's, multus'), a plugin of its chain keeps state that only that DEL frees, and no DEL can
run for it (reaper.reap.requests.waits_for_plugin: no pin to pass, and the chain is not one whose
every stateful plugin frees by container ID with a config the node vouches for). Such an entry
is kept for good (never lose the only record of state the reaper cannot free) and reported
apart from the orphans: it is no leak the reaper will reclaim, so the leak alerts leave it to an
alert of its own, whose runbook frees it with the plugin's own tools.
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
    """The report with each orphan no pass can do anything for as `waiting`, its reason the
    plugin it waits for and why. `allow_plugins`: --allow-plugin; `plugins_run`: False with
    --method kernel (no DEL runs at all); `gone_here`: the sandboxes a runtime of this node
    listed to this process and lists no more (reaper.runtime.listed; none in a one-shot)."""
    orphans = [a for a in report.attachments if a.verdict == "orphan"]
    if not any(could_wait(a, registry) for a in orphans):
        return report  # every orphan holds a namespace or more than a DEL needs: none waits
    records = index(snapshot, registry)
    configs = snapshot.configs
    trust = orphan_trust(snapshot, records, orphans, allow_plugins, gone_here=gone_here, registry=registry)
    changed = False
    attachments = []
    for a in report.attachments:
        why = (
            waits_for_plugin(a, records, configs, trust if plugins_run else None, registry)
            if a.verdict == "orphan"
            else None
        )
        if why is None:
            attachments.append(a)
            continue
        chain = stateful_chain(a, records, configs, None)
        plugins = tuple(chain) if isinstance(chain, list) else ()
        attachments.append(replace(a, verdict="waiting", reason=why, waits_for=plugins))
        changed = True
    return replace(report, attachments=tuple(attachments)) if changed else report
