"""Sandboxes this process was told of by the node's own runtimes: what proves a container ID
was this node's, for a DEL that frees it in a datastore the whole cluster shares (Calico's).

In memory only (never the state file), as digests of (endpoint, sandbox ID, pod namespace,
name), the last MAX_LISTED kept. Why: docs/design.md, "Sandboxes listed here".
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable

from reaper.model import Attachment, RuntimeView

MAX_LISTED = 100_000  # sandboxes remembered, all runtimes together
_DIGEST_BYTES = 16


def _digest(endpoint: str, sandbox_id: str, namespace: str, name: str) -> bytes:
    text = "\0".join((endpoint, sandbox_id, namespace, name))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=_DIGEST_BYTES).digest()


class ListedHere:
    """The sandboxes the runtimes of this node listed to this process since it started."""

    def __init__(self, limit: int = MAX_LISTED) -> None:
        self._limit = limit
        self._seen: OrderedDict[bytes, None] = OrderedDict()  # oldest listing first

    def __len__(self) -> int:
        return len(self._seen)

    def remember(self, view: RuntimeView) -> None:
        """Keep each sandbox a reachable view lists, under the runtime that listed it (unreachable: none)."""
        if not view.reachable:
            return
        for sandbox in view.sandboxes:
            if not sandbox.runtime:
                continue
            key = _digest(sandbox.runtime, sandbox.id, sandbox.namespace, sandbox.name)
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > self._limit:
            self._seen.popitem(last=False)

    def gone(self, attachments: Iterable[Attachment], view: RuntimeView) -> dict[str, tuple[str, str]]:
        """Container ID -> (namespace, name) of each attachment in no namespace whose sandbox a
        runtime of this node listed here before for the pod its cache entry names, while that
        runtime answers and every runtime asked answered without the ID (fail closed)."""
        if not view.reachable:
            return {}
        listed_now = {s.id for s in view.sandboxes}
        answered = {a.endpoint for a in view.runtimes if a.reachable and not a.skipped}
        found: dict[str, tuple[str, str]] = {}
        for attachment in attachments:
            cid, pod = attachment.key.container_id, attachment.pod
            if cid is None or pod is None or attachment.netns is not None or cid in listed_now:
                continue
            namespace, _, name = pod.partition("/")
            if any(_digest(endpoint, cid, namespace, name) in self._seen for endpoint in answered):
                found.setdefault(cid, (namespace, name))
        return found
