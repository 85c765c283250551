"""A CRI runtime made to order, a real grpc server on a unix socket in this process: it lists
the bytes it is given, answers PodSandboxStatus for the sandboxes it is told the netns of, and
counts what it was asked (how many status calls, which IDs, how many at once)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc

from tests.harness.cri import api_pb2 as pb

SERVICE = "runtime.v1.RuntimeService"


def sandbox_list(items: Iterable[pb.PodSandbox]) -> bytes:
    return pb.ListPodSandboxResponse(items=list(items)).SerializeToString()


def sandbox(sandbox_id: str, *, ready: bool = True, created_at: int = 1_700_000_000_000_000_000) -> pb.PodSandbox:
    state = pb.SANDBOX_READY if ready else pb.SANDBOX_NOTREADY
    metadata = pb.PodSandboxMetadata(name=f"pod-{sandbox_id}", uid=f"uid-{sandbox_id}", namespace="default")
    return pb.PodSandbox(id=sandbox_id, metadata=metadata, state=state, created_at=created_at)


class FakeRuntime:
    """Serves at `path` until closed. `listed`: the ListPodSandboxResponse's bytes; `netns`:
    sandbox ID -> the netns path its status gives (any other ID is NOT_FOUND); `status_delay`:
    how long each PodSandboxStatus is held before it is answered."""

    def __init__(self, path: Path, listed: bytes, netns: dict[str, str], status_delay: float = 0.0) -> None:
        self.path = path
        self.listed = listed
        self.netns = netns
        self.status_delay = status_delay
        self.calls: dict[str, int] = {"Version": 0, "ListPodSandbox": 0, "PodSandboxStatus": 0}
        self.status_ids: list[str] = []
        self.most_at_once = 0
        self._at_once = 0
        self._lock = threading.Lock()
        handlers = {
            "Version": grpc.unary_unary_rpc_method_handler(self._version),
            "ListPodSandbox": grpc.unary_unary_rpc_method_handler(self._list),
            "PodSandboxStatus": grpc.unary_unary_rpc_method_handler(self._status),
        }
        self._server = grpc.server(ThreadPoolExecutor(max_workers=32))
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self._server.add_insecure_port(f"unix://{path}")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"unix://{self.path}"

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1

    def _version(self, _request: bytes, _context: grpc.ServicerContext) -> bytes:
        self._count("Version")
        return pb.VersionResponse(version="0.1.0", runtime_name="fake-cri", runtime_version="1").SerializeToString()

    def _list(self, _request: bytes, _context: grpc.ServicerContext) -> bytes:
        self._count("ListPodSandbox")
        return self.listed

    def _status(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        sandbox_id = pb.PodSandboxStatusRequest.FromString(request).pod_sandbox_id
        with self._lock:
            self.calls["PodSandboxStatus"] += 1
            self.status_ids.append(sandbox_id)
            self._at_once += 1
            self.most_at_once = max(self.most_at_once, self._at_once)
        try:
            time.sleep(self.status_delay)
        finally:
            with self._lock:
                self._at_once -= 1
        path = self.netns.get(sandbox_id)
        if path is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no sandbox {sandbox_id}")
        info = json.dumps({"sandboxMetadata": {"NetNSPath": path}})
        status = pb.PodSandboxStatus(id=sandbox_id, state=pb.SANDBOX_READY)
        return pb.PodSandboxStatusResponse(status=status, info={"info": info}).SerializeToString()

    def close(self) -> None:
        self._server.stop(grace=None).wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class NotCri(threading.Thread):
    """A socket that is no CRI runtime: it counts the connections it is offered and hangs up on
    each, as a dead or foreign listener on a CRI path does."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.accepted = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


@contextlib.contextmanager
def decoy_runtime(tmp: Path) -> Iterator[Path]:
    """A runtime that answers and lists nothing, at a socket path of its own under `tmp` (a
    second runtime beside the node's: Docker's containerd with CRI on, a leftover k3s)."""
    path = tmp / "decoy" / "containerd.sock"
    path.parent.mkdir()
    with FakeRuntime(path, b"", {}):
        yield path
