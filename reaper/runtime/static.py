"""A fixed list of sandboxes: for tests of the pipeline and for dry runs of reconcile."""

from __future__ import annotations

from collections.abc import Mapping

from msgspec import Struct

from reaper.model import RuntimeView


class StaticLiveness(Struct, frozen=True):
    view: RuntimeView

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        return self.view
