"""Sources of what the runtime says is alive, behind one small interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from reaper.model import RuntimeView


class LivenessSource(Protocol):
    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        """The runtime's sandboxes now. `known_netns` maps sandbox IDs to netns paths already
        learned, so the source need not ask again. Never raises for runtime failures: a view
        with `reachable=False` says why."""
        ...
