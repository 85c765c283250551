"""Sources of what the runtime says is alive, behind one small interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from reaper.model import RuntimeView

if TYPE_CHECKING:
    from reaper.settings import Settings

# How many call deadlines (--runtime-timeout) one observe() may take, all runtimes together: a
# runtime's Version, ListPodSandbox and its PodSandboxStatus batch (one deadline for the
# batch) each have one, and a runtime whose turn comes after the whole has run out is that
# runtime's error.
OBSERVE_DEADLINES = 4


class LivenessSource(Protocol):
    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        """The runtimes' sandboxes now. `known_netns` maps a sandbox's status_key (its ID and
        creation time) to the netns path its runtime gave before, so the source need not ask
        again. Never raises for runtime failures: a view with `reachable=False` says why."""
        ...


def liveness_from(settings: Settings) -> LivenessSource:
    """The liveness source the settings name: every CRI runtime on the node, the endpoints
    given or else the ones discovery finds. Every command and the agent get theirs here."""
    from reaper.runtime.cri import CriLiveness  # noqa: PLC0415 (gRPC only for a command that asks)

    return CriLiveness(settings.runtime_endpoints, settings.runtime_timeout)
