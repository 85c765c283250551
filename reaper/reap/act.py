"""Acting on orphans the runtime just confirmed are not its own: plugin DEL, then each kind's
own reclaim for what DEL left, then a last look that says what is really gone."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from reaper.cni.invoke import del_network
from reaper.cni.requests import DelRequest, request_from_cache, safe_ifname
from reaper.host.quarantine import Quarantine
from reaper.kinds import COMMAND_TIMEOUT, ReclaimContext, cache
from reaper.kinds.registry import KINDS, RECLAIM_ORDER
from reaper.model import (
    Attachment,
    AttachmentKey,
    CacheEntry,
    Done,
    Identity,
    NetnsPin,
    NetworkConfig,
    NodeSnapshot,
    NsKey,
    ReclaimMethod,
    ReclaimOutcome,
    ResourceOutcome,
)
from reaper.stopwatch import Stopwatch

# Plugins are processes that spend part of their time waiting (host-local's lock, the
# kernel): two per core keep the cores busy.
DEL_WORKERS = min(8, 2 * (os.cpu_count() or 1))

Records = Mapping[Identity, Any]


def index(snapshot: NodeSnapshot) -> dict[Identity, Any]:
    """Every record of a snapshot by its kind's identity of it."""
    return {kind.identity(r): r for kind in KINDS for r in snapshot.of(kind.name)}


def _netns_for_del(attachment: Attachment, records: Records) -> str:
    """CNI_NETNS for DEL: the attachment's pin when it is still a real namespace, else empty."""
    for ref in attachment.resources:
        pin = records.get(ref.identity)
        if isinstance(pin, NetnsPin) and pin.is_namespace and os.path.exists(pin.path):
            return pin.path
    return ""


def del_request(attachment: Attachment, records: Records, configs: Sequence[NetworkConfig]) -> DelRequest | None:
    """What DEL would run for this attachment, or None when there is no config to run it with:
    its cache entry's config when the entry still names it, else the conf dir's config."""
    key = attachment.key
    if key.container_id is None or key.network is None:
        return None
    netns = _netns_for_del(attachment, records)
    entries = [records.get(ref.identity) for ref in attachment.resources if ref.kind == cache.KIND.name]
    usable = [e for e in entries if isinstance(e, CacheEntry) and not e.legacy and e.corrupt is None]
    if usable and key.ifname is not None:
        document = cache.current_document(usable[0])
        if document is not None and not document.legacy:
            request = request_from_cache(document.doc, key.container_id, key.network, key.ifname, netns, usable[0].path)
            if request is not None:
                return request
    for config in configs:
        if config.name == key.network and not config.path.startswith("cache:"):
            return DelRequest(key.container_id, key.network, safe_ifname(key.ifname), netns, config.raw, config.path)
    return None


@dataclass
class Reclaimer:
    """The act and verify steps of one pass."""

    look: Callable[[], NodeSnapshot]  # a fresh look at the node
    netns_dirs: tuple[str, ...]
    bin_dirs: tuple[str, ...]
    live_netns: frozenset[NsKey]  # namespaces the runtime named at the re-check
    plugin_timeout: float
    quarantine: Quarantine | None
    log: logging.Logger
    stop: threading.Event
    watch: Stopwatch = field(default_factory=Stopwatch)

    def run(
        self, attachments: Sequence[Attachment], requests: Mapping[AttachmentKey, DelRequest | None]
    ) -> list[ReclaimOutcome]:
        self.watch.restart()
        plugin_errors = self._del_all(attachments, requests)
        self.watch.lap("del")
        after_del = index(self.look())
        self.watch.lap("look")
        if self.stop.is_set():
            # Stopping: no new step starts. What DEL freed is reported; the rest waits.
            kernel_done = {i: Done.left("interrupted: stopping") for i in after_del}
        else:
            kernel_done = self._kernel(attachments, after_del)
        self.watch.lap("kernel")
        final = index(self.look())
        self.watch.lap("verify")
        outcomes = []
        for a in attachments:
            results = []
            for ref in a.resources:
                gone = ref.identity not in final
                method: ReclaimMethod
                error: str | None
                if ref.identity not in after_del and requests.get(a.key) is not None:
                    method, error = "cni-del", None
                else:
                    done = kernel_done.get(ref.identity)
                    method = "quarantine" if done is not None and done.quarantined else "kernel"
                    error = done.error if done is not None and not done.ok else None
                if not gone and error is None:
                    error = "still present after reclaiming"
                results.append(ResourceOutcome(ref.kind, ref.name, method, gone, None if gone else error))
            outcomes.append(ReclaimOutcome(a.key, tuple(results), plugin_errors.get(a.key, ())))
        return outcomes

    def _del_all(
        self, attachments: Sequence[Attachment], requests: Mapping[AttachmentKey, DelRequest | None]
    ) -> dict[AttachmentKey, tuple[str, ...]]:
        todo = [(a.key, request) for a in attachments if (request := requests.get(a.key)) is not None]

        def one(item: tuple[AttachmentKey, DelRequest]) -> tuple[AttachmentKey, tuple[str, ...]]:
            key, request = item
            if self.stop.is_set():
                return key, ()
            outcomes = del_network(request, self.bin_dirs, self.plugin_timeout, self.stop)
            return key, tuple(o.error for o in outcomes if o.error)

        with ThreadPoolExecutor(max_workers=DEL_WORKERS) as pool:
            results = dict(pool.map(one, todo))
        for key, errors in results.items():
            for error in errors:
                self.log.warning("plugin DEL failed", extra={"attachment": key.as_text(), "error": error})
        return results

    def _kernel(self, attachments: Sequence[Attachment], present: Records) -> dict[Identity, Done]:
        """Each kind reclaims what is still there, in the registry's order. A `last` kind's
        record goes only once every other resource of its attachment is gone: it is what a
        later DEL would need."""
        done: dict[Identity, Done] = {}
        last_kinds = {k.name for k in RECLAIM_ORDER if k.last}
        for kind in RECLAIM_ORDER:
            records = []
            for a in attachments:
                for ref in a.resources:
                    if ref.kind != kind.name or ref.identity not in present:
                        continue
                    if kind.last:
                        others = [r.identity for r in a.resources if r.kind not in last_kinds and r.identity in present]
                        if not all(done.get(i, Done.freed()).ok for i in others):
                            done[ref.identity] = Done.left("kept: other resources of the attachment remain")
                            continue
                    records.append(present[ref.identity])
            if not records:
                continue
            ctx = ReclaimContext(
                self.netns_dirs, self.bin_dirs, self.live_netns, self.quarantine, COMMAND_TIMEOUT, dict(done)
            )
            done.update(kind.reclaim(records, ctx))
        return done
