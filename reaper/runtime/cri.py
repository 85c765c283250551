"""Liveness from every CRI runtime on the node (containerd, CRI-O, cri-dockerd, k3s) over gRPC."""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from reaper.host.files import namespace_of
from reaper.host.jsondoc import parse_json
from reaper.model import RuntimeAnswer, RuntimeView, Sandbox
from reaper.names import MAX_PATH
from reaper.runtime import api_pb2 as pb
from reaper.runtime.client import CriError, RuntimeClient
from reaper.runtime.discovery import KNOWN_SOCKETS, NAME_THEM, REFUSED, Endpoint, close_all, discover, socket_path
from reaper.runtime.liveness import OBSERVE_DEADLINES

# PodSandboxStatus calls one runtime has in flight at once, all within one deadline.
STATUS_IN_FLIGHT = 8


def netns_path_from_info(info: Mapping[str, str]) -> str | None:
    """The sandbox's netns path from PodSandboxStatus(verbose) info (containerd's or CRI-O's)."""
    raw = info.get("info")
    try:
        doc = parse_json(raw) if raw else None
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
    linux = spec.get("linux") if isinstance(spec, dict) else None
    namespaces = linux.get("namespaces") if isinstance(linux, dict) else None
    for ns in namespaces if isinstance(namespaces, list) else ():
        if isinstance(ns, dict) and ns.get("type") == "network":
            path = ns.get("path")
            return path if isinstance(path, str) and path else None
    return None


def _unfit_socket(path: str) -> str | None:
    """Why a given endpoint's path cannot be a runtime's socket, said plainly (gRPC's words for
    it are three nested errors long); None when it is a socket, for gRPC to ask."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"no socket at {path}"
    except OSError as err:
        return f"{path}: {err.strerror}"
    return None if stat.S_ISSOCK(mode) else f"{path} is not a socket"


def _refused(path: str, timeout: float) -> bool:
    """Nobody listens on this socket file (a runtime that is stopped, or long gone)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return True
        except OSError:
            return False  # let the CRI call say what is wrong
    return False


class CriLiveness:
    """Every CRI runtime on the node: the endpoints given, else discovery's (one only an
    untrusted process named is skipped, never asked). A sandbox any lists is live; one runtime
    that cannot be asked makes the view unreachable. observe() takes OBSERVE_DEADLINES at most."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        timeout: float,
        find: Callable[[], list[Endpoint]] = discover,
    ) -> None:
        self.endpoints = endpoints
        self.timeout = timeout
        self.find = find

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        candidates = [Endpoint(e, "--runtime-endpoint") for e in self.endpoints] or self.find()
        try:
            return self._observe_all(candidates, known_netns)
        finally:
            close_all(candidates)

    def _observe_all(self, candidates: list[Endpoint], known_netns: Mapping[str, str]) -> RuntimeView:
        if not candidates:
            tried = ", ".join(path for _, path in KNOWN_SOCKETS)
            return _unreachable("", f"no CRI socket found (tried the kubelet's and {tried})", ())
        deadline = time.monotonic() + OBSERVE_DEADLINES * self.timeout
        answers: list[RuntimeAnswer] = []
        sandboxes: dict[str, Sandbox] = {}
        problems: list[str] = []
        for endpoint in candidates:
            if endpoint.refused is not None:  # a process that is not the node's kubelet named it
                answers.append(_unanswered(endpoint, endpoint.refused, skipped=True))
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"{endpoint.url}: not asked: the time for asking the runtimes ran out"
                answers.append(_unanswered(endpoint, why))
                problems.append(why)
                continue
            unfit = _unfit_socket(endpoint.path) if self.endpoints else endpoint.unaskable
            if unfit is None and not self.endpoints and _refused(socket_path(endpoint.target), min(self.timeout, left)):
                # A crashed runtime leaves its socket file and its sandboxes: never one to skip.
                unfit = f"{REFUSED}; {NAME_THEM}"
            if unfit is not None:
                answers.append(_unanswered(endpoint, unfit))
                problems.append(unfit if self.endpoints else f"{endpoint.url}: {unfit}")
                continue
            try:
                with RuntimeClient(endpoint.url, self.timeout, endpoint.target, deadline) as client:
                    answer, listed = self._observe(client, endpoint, known_netns)
            except CriError as err:
                answers.append(_unanswered(endpoint, str(err)))
                problems.append(str(err))
                continue
            answers.append(answer)
            for sandbox in listed:
                sandboxes.setdefault(sandbox.id, sandbox)
        return _together(tuple(answers), tuple(sandboxes.values()), problems)

    def _observe(
        self, client: RuntimeClient, endpoint: Endpoint, known_netns: Mapping[str, str]
    ) -> tuple[RuntimeAnswer, list[Sandbox]]:
        version = client.version()
        items = client.list_pod_sandboxes()
        # Only sandboxes whose netns no earlier answer gave, each ID once, READY and NOTREADY
        # alike: a NOTREADY sandbox's pin is still its own.
        needed = {item.id: None for item in items if item.id and f"{item.id}@{item.created_at}" not in known_netns}
        netns_of = partial(_netns_of, client.endpoint)
        statuses = client.pod_sandbox_statuses(
            list(needed), netns_of, in_flight=STATUS_IN_FLIGHT, deadline=time.monotonic() + self.timeout
        )
        sandboxes = []
        for item in items:
            status_key = f"{item.id}@{item.created_at}"
            netns_path = known_netns.get(status_key, statuses.get(item.id, ""))
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
                    status_key=status_key,
                    runtime=client.endpoint,
                )
            )
        answer = RuntimeAnswer(
            endpoint=client.endpoint,
            source=endpoint.source,
            name=version.runtime_name or None,
            version=version.runtime_version or None,
            reachable=True,
            error=None,
            sandboxes=len(sandboxes),
        )
        return answer, sandboxes


def _unanswered(endpoint: Endpoint, error: str, *, skipped: bool = False) -> RuntimeAnswer:
    """A runtime that gave no answer this pass (skipped: not asked on purpose), and why."""
    return RuntimeAnswer(
        endpoint=endpoint.url,
        source=endpoint.source,
        name=None,
        version=None,
        reachable=False,
        error=error,
        sandboxes=0,
        skipped=skipped,
    )


def _netns_of(endpoint: str, answer: pb.PodSandboxStatusResponse | None) -> str:
    """The netns path a PodSandboxStatus gives; "" for a sandbox removed since it was listed
    (None), on the host's network, or whose runtime names none. CriError past PATH_MAX."""
    if answer is None or answer.status.linux.namespaces.options.network == pb.NODE:
        return ""
    path = netns_path_from_info(answer.info) or ""
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH:
        raise CriError(f"PodSandboxStatus on {endpoint}: a netns path over {MAX_PATH} bytes")
    return path


def _unreachable(endpoint: str, error: str, answers: tuple[RuntimeAnswer, ...]) -> RuntimeView:
    return RuntimeView(
        endpoint=endpoint, name=None, version=None, reachable=False, error=error, sandboxes=(), runtimes=answers
    )


def _together(answers: tuple[RuntimeAnswer, ...], sandboxes: tuple[Sandbox, ...], problems: list[str]) -> RuntimeView:
    asked = [a for a in answers if not a.skipped]
    if not asked:
        why = "; ".join(f"{a.endpoint}: {a.error}" for a in answers)
        return _unreachable("", f"no CRI runtime answers ({why})", answers)
    endpoint = ", ".join(a.endpoint for a in asked)
    if problems:
        return _unreachable(endpoint, "; ".join(problems), answers)
    first = asked[0]  # with no problem, every runtime asked answered
    return RuntimeView(
        endpoint=endpoint,
        name=first.name,
        version=first.version,
        reachable=True,
        error=None,
        sandboxes=sandboxes,
        runtimes=answers,
    )
