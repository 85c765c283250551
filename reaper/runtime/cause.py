"""Why no runtime answered, as one line on stderr the operator can act on (the report lists each
socket); pure: from what the pass saw and the layout already read."""

from __future__ import annotations

from reaper.layout import Layout, RuntimeLayout
from reaper.model import RuntimeAnswer, RuntimeView
from reaper.runtime.discovery import NAME_THEM, REFUSED, socket_path


def refused(answer: RuntimeAnswer) -> bool:
    """A runtime whose socket file is there and nobody listens on it (it crashed, or stopped)."""
    return not answer.skipped and REFUSED in (answer.error or "")


def likely_cause(view: RuntimeView, layout: Layout | None) -> str:
    """One line: why `view` (unreachable) has no answer, and what to look at."""
    runtimes = layout.runtimes if layout is not None else ()
    failed = [a for a in view.runtimes if not a.skipped and not a.reachable]
    if any(not refused(a) for a in failed) or (not failed and any(not a.skipped for a in view.runtimes)):
        # A runtime was asked and failed (an error, a timeout, no socket at a path given, a
        # path that leads to no socket of root's): its own words are the cause, each once.
        return view.error or "a runtime gave no answer"
    if failed:  # only sockets nobody listens on: runtimes that crashed or were stopped
        dead = {socket_path(a.endpoint) for a in failed}
        named = [_not_serving(r) for r in runtimes if r.socket in dead]
        known = {r.socket for r in runtimes}
        named += [f"nothing listens on {path}: has the runtime that made it crashed?" for path in sorted(dead - known)]
        return f"{'; '.join(named)}; {NAME_THEM}"
    silent = [socket_path(a.endpoint) for a in view.runtimes]  # endpoints reported, not asked
    configured = [r for r in runtimes if not silent or r.socket in silent] or list(runtimes)
    if configured:
        return "; ".join(_not_serving(r) for r in configured)
    if silent:
        return f"nothing listens on {', '.join(silent)}: is the runtime that made it running?"
    return (
        "no CRI runtime here: none of the known sockets and no runtime's config are on this node "
        "(is this a Kubernetes node, and does this process see the host's /run and /etc?)"
    )


def _not_serving(runtime: RuntimeLayout) -> str:
    config = runtime.sources[0] if runtime.sources else "its config"
    return (
        f"{runtime.runtime}'s config is here ({config}) but nothing listens on its socket "
        f"{runtime.socket}: is {runtime.runtime} running?"
    )
