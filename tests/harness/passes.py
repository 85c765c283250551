"""What the kind and reclaim tests share: a reclaimer with nothing around it, a look at a tree
of the test's own, a node config, and reconciling a snapshot as often as the policy asks."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from reaper.host.memo import RACY_NS, InventoryMemo
from reaper.kinds import Look
from reaper.kinds.netconf import parse_network_config
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import AttachmentHistory, NetworkConfig, NodeSnapshot, Policy, RuntimeView, ScanReport
from reaper.options import FindOptions
from reaper.reap.act import Reclaimer
from reaper.reconcile import reconcile
from reaper.settings import DEL_CONCURRENCY
from tests.harness.snapshots import runtime, snapshot


def bare_reclaimer(
    look: Callable[[], NodeSnapshot] = snapshot,
    observe: Callable[[], RuntimeView] = runtime,
    bin_dirs: tuple[str, ...] = (),
    plugin_timeout: float = 1.0,
    del_concurrency: int = DEL_CONCURRENCY,
    registry: Registry = REGISTRY,
    clock: Callable[[], float] = time.monotonic,
) -> Reclaimer:
    """A reclaimer with no netns dirs, no quarantine and a runtime that lists nothing, of the
    kinds in `registry` (a fake node's: tests.harness.reclaim_fakes.FakeNode.registry), its
    re-check windows judged on `clock`."""
    return Reclaimer(
        del_concurrency=del_concurrency,
        look=look,
        netns_dirs=(),
        bin_dirs=bin_dirs,
        live_netns=frozenset(),
        plugin_timeout=plugin_timeout,
        quarantine=None,
        log=logging.getLogger("test"),
        stop=threading.Event(),
        observe=observe,
        registry=registry,
        clock=clock,
    )


def options_at(cache_dir: Path) -> FindOptions:
    """Find options with only a cache dir (and a conf dir that does not exist)."""
    return FindOptions(
        netns_dirs=(),
        ipam_dirs=(),
        cache_dir=str(cache_dir),
        conf_dir=str(cache_dir / "no-conf-dir"),
        bin_dirs=(),
        netns_patterns=(re.compile("x"),),
    )


def settled_memo() -> InventoryMemo:
    """A memo whose passes run as if long after the test wrote its files: a file changed less
    than RACY_NS before a pass is never remembered (see reaper.host.memo)."""
    return InventoryMemo(clock=lambda: time.time_ns() + 10 * RACY_NS)


def look_at(cache_dir: Path, *configs: NetworkConfig, memo: InventoryMemo | None = None) -> Look:
    return Look(options_at(cache_dir), memo or InventoryMemo(), configs, {})


def node_config(*plugins: dict[str, object], name: str = "mynet") -> NetworkConfig:
    """A conf dir's config of `plugins`, as the node's own."""
    raw = json.dumps({"cniVersion": "1.0.0", "name": name, "plugins": list(plugins)}).encode()
    return parse_network_config(raw, f"/etc/cni/net.d/10-{name}.conflist")


def write_private(directory: Path, name: str, data: bytes) -> Path:
    """A file as plugins write theirs: in a 0700 dir."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / name
    path.write_bytes(data)
    return path


def with_records(snap: NodeSnapshot, **more: tuple[Any, ...]) -> NodeSnapshot:
    return replace(snap, resources={**snap.resources, **more})


def confirmed(snap: NodeSnapshot, policy: Policy, now: float, *sandboxes: Any) -> ScanReport:
    """The report once the policy's confirmations are counted."""
    history: dict[str, AttachmentHistory] = {}
    for _ in range(policy.confirmations):
        report, history = reconcile(snap, runtime(*sandboxes), history, policy, now)
    return report


def verdicts_and_kinds(report: ScanReport) -> dict[str | None, tuple[str, list[str]]]:
    return {a.key.container_id: (a.verdict, sorted(r.kind for r in a.resources)) for a in report.attachments}
