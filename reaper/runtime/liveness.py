"""Sources of what the runtime says is alive, behind one small interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from reaper.model import RuntimeView

if TYPE_CHECKING:
    from reaper.settings import Settings

# Call deadlines (--runtime-timeout) one observe() may take, all runtimes together: one each for
# a runtime's Version, ListPodSandbox and PodSandboxStatus batch; a runtime whose turn comes after
# they have run out is that runtime's error.
OBSERVE_DEADLINES = 4


class LivenessSource(Protocol):
    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        """The runtimes' sandboxes now. `known_netns` maps a sandbox's status_key (its ID and
        creation time) to the netns path its runtime gave before, so the source need not ask
        again. Never raises for runtime failures: a view with `reachable=False` says why."""
        ...


def liveness_from(settings: Settings) -> LivenessSource:
    """Every command's and the agent's liveness source: every CRI runtime on the node, given or else discovered."""
    from reaper.runtime.cri import CriLiveness  # noqa: PLC0415 (gRPC only for a command that asks)

    return CriLiveness(settings.runtime_endpoints, settings.runtime_timeout)
