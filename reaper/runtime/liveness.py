"""Sources of what the runtime says is alive, behind one small interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from reaper.model import RuntimeView


class LivenessSource(Protocol):
    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        """The runtimes' sandboxes now. `known_netns` maps a sandbox's status_key (its ID and
        creation time) to the netns path its runtime gave before, so the source need not ask
        again. Never raises for runtime failures: a view with `reachable=False` says why."""
        ...
