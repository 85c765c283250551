"""One reap pass whose runtime changes its answer between the plan and the re-check.

Usage: racing_reap.py MODE HIDE_IDS -- <reaper flags>. MODE `reappear`: the first list hides
HIDE_IDS (comma-separated), the re-check shows them. MODE `unreachable`: the re-check fails.
MODE `empty`: the runtime answers every time with an empty list. MODE `reappear-late`: the
first two lists (the scan's and the re-check of the whole plan) hide HIDE_IDS, every later one
(the re-check right before each attachment's DEL) shows them. MODE `unreachable-late`: the
runtime stops answering after the plan's re-check, before the DELs. MODE `hidden`: every list
hides HIDE_IDS (a runtime that forgot them for this pass); with --dry-run --plan-out the plan
is written as `reaper reap` writes it.
Prints reap_json; run it inside the lab netns.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping

from msgspec.structs import replace

from reaper.cli import build_parser
from reaper.host.atomic import write_atomically
from reaper.model import RuntimeView
from reaper.reap import reap_pass
from reaper.reap.review import plan_document, this_node
from reaper.report import reap_json
from reaper.runtime.cri import CriLiveness
from reaper.settings import reap_settings_from, settings_from


class ChangingRuntime:
    def __init__(self, inner: CriLiveness, mode: str, hide: set[str]) -> None:
        self.inner, self.mode, self.hide, self.calls = inner, mode, hide, 0

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        self.calls += 1
        view = self.inner.observe(known_netns)
        if self.mode == "empty":
            return replace(view, sandboxes=())
        hidden = (
            self.mode == "hidden"
            or (self.mode == "reappear" and self.calls == 1)
            or (self.mode == "reappear-late" and self.calls <= 2)
        )
        if hidden:
            return replace(view, sandboxes=tuple(s for s in view.sandboxes if s.id not in self.hide))
        if (self.calls == 2 and self.mode == "unreachable") or (self.calls > 2 and self.mode == "unreachable-late"):
            return RuntimeView(
                endpoint=view.endpoint,
                name=None,
                version=None,
                reachable=False,
                error="connection refused (injected)",
                sandboxes=(),
            )
        return view


def main(argv: list[str]) -> None:
    mode, hide, flags = argv[0], set(filter(None, argv[1].split(","))), argv[3:]
    args = build_parser().parse_args(["reap", *flags])
    settings, policy = settings_from(args, {}), reap_settings_from(args, {})
    runtime = ChangingRuntime(CriLiveness(settings.runtime_endpoints, settings.runtime_timeout), mode, hide)
    result = reap_pass(settings, policy, runtime, logging.getLogger("race"))
    if policy.plan_out is not None:
        document = plan_document(result.plan, result.report.attachments, this_node(), time.time())
        write_atomically(policy.plan_out, document, 0o600)
    json.dump(reap_json(result), sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
