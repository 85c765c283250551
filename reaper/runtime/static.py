"""A fixed list of sandboxes: for tests of the pipeline and for dry runs of reconcile."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from msgspec import Struct

from reaper.model import RuntimeView


class StaticLiveness(Struct, frozen=True):
    view: RuntimeView

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        return self.view

    def ask(self, known_netns: Mapping[str, str]) -> Callable[[], RuntimeView]:
        return partial(self.observe, known_netns)
