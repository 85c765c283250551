"""A fixed list of sandboxes: a liveness source for tests of the pipeline."""

from __future__ import annotations

from collections.abc import Mapping

from msgspec import Struct

from reaper.model import RuntimeView


class StaticLiveness(Struct, frozen=True):
    view: RuntimeView

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        return self.view
