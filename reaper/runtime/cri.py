"""Liveness from a CRI runtime (containerd, CRI-O, cri-dockerd) over gRPC."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from reaper.host.files import namespace_of
from reaper.model import RuntimeView, Sandbox
from reaper.runtime import api_pb2 as pb
from reaper.runtime.client import DEFAULT_ENDPOINTS, CriError, RuntimeClient


def netns_path_from_info(info: Mapping[str, str]) -> str | None:
    """The sandbox's netns path from PodSandboxStatus(verbose) info (containerd's or CRI-O's)."""
    raw = info.get("info")
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    meta = doc.get("sandboxMetadata")
    if isinstance(meta, dict):
        for holder in (meta, meta.get("Metadata")):
            path = holder.get("NetNSPath") if isinstance(holder, dict) else None
            if isinstance(path, str) and path:
                return path
    return _spec_netns(doc.get("runtimeSpec"))


def _spec_netns(spec: Any) -> str | None:
    if not isinstance(spec, dict) or not isinstance(spec.get("linux"), dict):
        return None
    namespaces = spec["linux"].get("namespaces")
    if not isinstance(namespaces, list):
        return None
    for ns in namespaces:
        if isinstance(ns, dict) and ns.get("type") == "network":
            path = ns.get("path")
            return path if isinstance(path, str) and path else None
    return None


def _socket_path(endpoint: str) -> str:
    return endpoint[len("unix://") :] if endpoint.startswith("unix://") else endpoint


class CriLiveness:
    def __init__(self, endpoint: str | None, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout

    def _candidates(self) -> list[str]:
        if self.endpoint is not None:
            return [self.endpoint]
        return [e for e in DEFAULT_ENDPOINTS if os.path.exists(_socket_path(e))]

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        candidates = self._candidates()
        if not candidates:
            tried = ", ".join(DEFAULT_ENDPOINTS)
            return RuntimeView("", None, None, False, f"no CRI socket found (tried {tried})", ())
        last_error = ""
        for endpoint in candidates:
            try:
                with RuntimeClient(endpoint, self.timeout) as client:
                    return self._observe(client, known_netns)
            except CriError as err:
                last_error = str(err)
        return RuntimeView(candidates[-1], None, None, False, last_error, ())

    def _observe(self, client: RuntimeClient, known_netns: Mapping[str, str]) -> RuntimeView:
        version = client.version()
        items = client.list_pod_sandboxes()
        sandboxes = []
        for item in items:
            netns_path = known_netns.get(item.id)
            if netns_path is None:
                netns_path = self._ask_netns(client, item.id)
            sandboxes.append(
                Sandbox(
                    id=item.id,
                    name=item.metadata.name,
                    namespace=item.metadata.namespace,
                    uid=item.metadata.uid,
                    ready=item.state == pb.SANDBOX_READY,
                    # A sandbox that failed early reports Go's zero time (a huge negative number).
                    created_at=item.created_at / 1e9 if item.created_at > 0 else None,
                    netns_path=netns_path or None,
                    netns=namespace_of(netns_path),
                )
            )
        return RuntimeView(
            endpoint=client.endpoint,
            name=version.runtime_name or None,
            version=version.runtime_version or None,
            reachable=True,
            error=None,
            sandboxes=tuple(sandboxes),
        )

    def _ask_netns(self, client: RuntimeClient, sandbox_id: str) -> str:
        try:
            status = client.pod_sandbox_status(sandbox_id, verbose=True)
        except CriError as err:
            if "NOT_FOUND" in str(err):
                return ""  # removed since it was listed
            raise
        if status.status.linux.namespaces.options.network == pb.NODE:
            return ""  # host network: no netns of its own
        return netns_path_from_info(status.info) or ""
