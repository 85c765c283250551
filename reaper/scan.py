"""One read-only pass: look, ask the runtimes, correlate, reconcile, save the confirmations.

The node is read first, who is in each namespace included, and the runtimes are asked second,
so nothing the look saw is newer than their answer (why that order is safe: docs/design.md, "The
safety argument"). A one-shot run reads every file afresh and keeps no memo on disk, where a
writer of the state dir could shape it (issue 23; SECURITY.md, "The state file"); the agent keeps
its memo in memory. A `<state file>.memo` an older version left is never read, written or removed."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from msgspec.structs import replace

from reaper.correlate import join
from reaper.host.memo import InventoryMemo
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import VERDICTS, AttachmentHistory, RuntimeView, ScanReport, ScanResult
from reaper.reconcile import reconcile
from reaper.runtime.liveness import LivenessSource
from reaper.settings import Settings
from reaper.snapshot import look_at_node
from reaper.state import KeptState, State, StateError, load_state, save_state
from reaper.stopwatch import Stopwatch


def scan_pass(
    settings: Settings,
    liveness: LivenessSource,
    log: logging.Logger,
    clock: Callable[[], float] = time.time,
    memo: InventoryMemo | None = None,
    kept: KeptState | None = None,
    save: bool = True,
    *,
    allow_plugins: Sequence[str] = (),
    plugins_run: bool = True,
    registry: Registry = REGISTRY,
) -> ScanResult:
    """One pass. A long-running caller passes the same `memo` and `kept` every time (unchanged
    files are not read again; counts come from its own last pass, not the file). `save` False:
    a look for `explain`, which counts no pass. `allow_plugins` and `plugins_run` (False:
    --method kernel) say which orphans are `waiting` (reaper.reap.waiting)."""
    started = time.monotonic()
    warnings: list[str] = []
    state = _load(settings, kept, warnings)
    # The node first, the runtime second (see above).
    memo = memo if memo is not None else InventoryMemo()  # a one-shot's: this pass only
    snapshot, ties = look_at_node(settings.find, memo, registry)
    watch = Stopwatch()
    # What PodSandboxStatus said to this process before, never a file's word.
    known = dict(kept.sandbox_netns) if kept is not None else {}
    runtime = liveness.observe(known)
    watch.lap("liveness")
    now = clock()
    runtime, first_seen = _dated(runtime, state, now)
    correlation = join(ties, runtime)
    report, history = reconcile(snapshot, runtime, state.attachments, settings.policy, now, correlation)
    # Imported here: the reaper.reap package imports this module.
    from reaper.reap.waiting import mark_waiting  # noqa: PLC0415 (the comment above)

    gone_here = _gone_here(kept, report, runtime)
    report = mark_waiting(
        report, snapshot, allow_plugins=tuple(allow_plugins), plugins_run=plugins_run, gone_here=gone_here,
        registry=registry,
    )  # fmt: skip
    watch.lap("reconcile")
    if save:
        netns_map, saved = _save(settings, kept, state, runtime, known, history, first_seen, warnings)
    else:
        netns_map, saved = known, False
    watch.lap("state")
    timings = (*snapshot.timings, *watch.laps)
    seconds = time.monotonic() - started
    _log_pass(log, warnings, report, seconds, timings)
    return ScanResult(
        report=report,
        snapshot=snapshot,
        known_netns=netns_map if runtime.reachable else known,
        state_saved=saved,
        warnings=tuple(warnings),
        seconds=seconds,
        timings=timings,
        gone_here=gone_here,
    )


def _gone_here(kept: KeptState | None, report: ScanReport, runtime: RuntimeView) -> dict[str, tuple[str, str]]:
    """The orphans in no namespace whose sandbox a runtime listed to this process before and no
    runtime lists now (a one-shot: none; reaper.runtime.listed); then remember this listing."""
    if kept is None:
        return {}
    orphans = (a for a in report.attachments if a.verdict == "orphan")
    gone = kept.listed.gone(orphans, runtime)
    kept.listed.remember(runtime)
    return gone


def _load(settings: Settings, kept: KeptState | None, warnings: list[str]) -> State:
    """The confirmations so far: a long-running caller's own, else the state file's."""
    if kept is not None and kept.state is not None:
        return kept.state
    state, warning = load_state(settings.state_file)
    if warning:
        warnings.append(warning)
    return state


def _dated(runtime: RuntimeView, state: State, now: float) -> tuple[RuntimeView, dict[str, float]]:
    """The view with a creation time for each sandbox (first seen, where the runtime gives none), and those times."""
    first_seen = {s.id: state.sandbox_first_seen.get(s.id, now) for s in runtime.sandboxes if s.created_at is None}
    sandboxes = tuple(
        s if s.created_at is not None else replace(s, created_at=first_seen[s.id]) for s in runtime.sandboxes
    )
    return replace(runtime, sandboxes=sandboxes), first_seen


def _save(
    settings: Settings,
    kept: KeptState | None,
    state: State,
    runtime: RuntimeView,
    known: dict[str, str],
    history: Mapping[str, AttachmentHistory],
    first_seen: dict[str, float],
    warnings: list[str],
) -> tuple[dict[str, str], bool]:
    """Save the new state (the old first-seen times when the runtimes did not answer). The
    netns map the runtimes gave (memory only; `known` when they did not answer), and whether
    the file was written."""
    if runtime.reachable:
        netns_map = {s.status_key: s.netns_path for s in runtime.sandboxes if s.netns_path and s.status_key}
    else:
        netns_map, first_seen = known, dict(state.sandbox_first_seen)
    new_state = State(history, first_seen, state.counters)  # the textfile's, carried
    if kept is not None:
        kept.state, kept.sandbox_netns = new_state, netns_map
    try:
        save_state(settings.state_file, new_state)
    except StateError as err:
        warnings.append(f"{err}; confirmations will not carry to the next pass")
        return netns_map, False
    return netns_map, True


def _log_pass(
    log: logging.Logger, warnings: list[str], report: ScanReport, seconds: float, timings: tuple[tuple[str, float], ...]
) -> None:
    for text in warnings:
        log.warning(text)
    for failure in report.errors:
        log.warning("inventory source failed", extra={"source": failure.source, "error": failure.error})
    log.debug("pass timings", extra=dict(timings))
    log.debug(
        "scan pass",
        extra={
            "seconds": round(seconds, 3),
            "runtime_reachable": report.runtime.reachable,
            **{v: report.count(v) for v in VERDICTS},
            "stuck_sandboxes": len(report.stuck_sandboxes),
            "corrupt_files": sum(c.count for c in report.corrupt),
        },
    )
