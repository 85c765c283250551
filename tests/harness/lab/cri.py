"""The CRI calls only the lab makes (creating, stopping and removing pod sandboxes), and the
lab's own reading of the runtime's answers, decoded by protobuf: the product's client is
read-only on purpose (a reaper never creates or changes a sandbox), and reads its answers with
its own subset of the messages (reaper/runtime/api.proto)."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import Message

from reaper.runtime.client import RuntimeClient
from tests.harness.cri import api_pb2 as pb

M = TypeVar("M", bound=Message)


class LabRuntimeClient(RuntimeClient):
    def _pb(self, method: str, request: Message, answer: type[M]) -> M:
        return answer.FromString(self.call(method, request.SerializeToString()))

    def run_pod_sandbox(self, config: pb.PodSandboxConfig) -> str:
        req = pb.RunPodSandboxRequest(config=config)
        return self._pb("RunPodSandbox", req, pb.RunPodSandboxResponse).pod_sandbox_id

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._pb("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), pb.StopPodSandboxResponse)

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        req = pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
        self._pb("RemovePodSandbox", req, pb.RemovePodSandboxResponse)

    def pb_sandboxes(self) -> list[pb.PodSandbox]:
        return list(self._pb("ListPodSandbox", pb.ListPodSandboxRequest(), pb.ListPodSandboxResponse).items)

    def pb_status(self, sandbox_id: str) -> pb.PodSandboxStatusResponse:
        req = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True)
        return self._pb("PodSandboxStatus", req, pb.PodSandboxStatusResponse)
