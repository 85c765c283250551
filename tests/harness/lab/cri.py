"""The CRI calls only the lab makes: creating, stopping and removing pod sandboxes. The
product's client is read-only on purpose; a reaper never creates or changes a sandbox."""

from __future__ import annotations

from reaper.runtime import api_pb2 as pb
from reaper.runtime.client import RuntimeClient


class LabRuntimeClient(RuntimeClient):
    def run_pod_sandbox(self, config: pb.PodSandboxConfig) -> str:
        req = pb.RunPodSandboxRequest(config=config)
        return self._call("RunPodSandbox", req, pb.RunPodSandboxResponse).pod_sandbox_id

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), pb.StopPodSandboxResponse)

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        req = pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
        self._call("RemovePodSandbox", req, pb.RemovePodSandboxResponse)
