"""One read-only pass, one way: look, ask the runtimes, correlate, reconcile, save (confirmations
are kept in the state file).

The node first, the runtime second: the look reads everything the verdicts need from the node,
who is in each namespace included, before any runtime is asked, so nothing it read is newer
than the runtimes' answer. Why that order is safe, for what can change between the two reads:
- a sandbox born in between is listed: whatever of it the look saw is live. One in the look
  but not listed yet (mid-creation: containerd lists a sandbox once its network is up) is
  younger than --min-age and must stay unowned for --confirmations passes, in either order;
- a process seen in a namespace is evidence of use at that moment, whenever it was read: one
  that left since only keeps the namespace a pass longer. One that entered after the walk is
  missed, as a walk after the runtimes misses one entering a moment after it; no order makes
  the look "now". The reclaim asks the runtimes and walks /proc and the mounts again right
  before it acts (reaper.reap.act, unchanged by this order), so a namespace entered since the
  look is left.

A one-shot run (a timer's `reaper scan` or `reaper reap`) reads every file afresh: it keeps no
memo of parsed files on disk. A memo there was an input whoever writes the state dir could
shape (a cache entry's netns taken away made a running container's attachment an orphan,
issue 23); the state file alone carries from run to run, and it holds no evidence. A
`<state file>.memo` an older version left is never read, written or removed: it is inert.
The long-running agent keeps its memo in memory, where no one else writes."""

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
    """One pass. A long-running caller passes the same `memo` every time (files unchanged
    since the last pass are not read again); a one-shot run passes none and reads every file.
    `kept`: a long-running caller's state of its last pass, counted from instead of the file
    once it holds one (see reaper.state). `save` False: a look for a person (`explain`), which
    reads the confirmations counted so far and counts no pass of its own. `allow_plugins` and
    `plugins_run` (False: --method kernel) say which orphans are `waiting` (reaper.reap.waiting).

    Load the state, look at the node, ask the runtimes, correlate, reconcile, save."""
    started = time.monotonic()
    warnings: list[str] = []
    state = _load(settings, kept, warnings)
    # The node first, the runtime second (see above): a sandbox born in between is then newer
    # than anything in the look that could be mistaken for one of its resources.
    memo = memo if memo is not None else InventoryMemo()  # a one-shot's: this pass only
    snapshot, ties = look_at_node(settings.find, memo, registry)
    watch = Stopwatch()
    # What PodSandboxStatus said to this process before, by (sandbox ID, creation time): never a
    # file's word (a cache entry's or the state file's).
    known = dict(kept.sandbox_netns) if kept is not None else {}
    runtime = liveness.observe(known)
    watch.lap("liveness")
    now = clock()
    runtime, first_seen = _dated(runtime, state, now)
    correlation = join(ties, runtime)
    report, history = reconcile(snapshot, runtime, state.attachments, settings.policy, now, correlation)
    # Imported here: the reaper.reap package imports this module.
    from reaper.reap.waiting import mark_waiting  # noqa: PLC0415 (the comment above)

    # What this process was told by the runtimes before, never a file's word (reaper.runtime.listed).
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
    _log_pass(log, warnings, report, runtime.reachable, seconds, timings)
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
    """The orphans in no namespace whose sandbox a runtime of this node listed to this process
    on an earlier pass and that every runtime now answers without (a one-shot run: none); then
    this pass's listing is remembered too."""
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
    """The view with a creation time for every sandbox (when it was first seen, for those the
    runtime gives none), and those first-seen times."""
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
    """Save the new state: the first-seen times, or the old state's when the runtimes could not
    be asked. The netns map the runtimes gave (kept in memory only, for a long-running caller;
    `known`, what they gave before, when they could not be asked), and whether it was saved."""
    if runtime.reachable:
        netns_map = {s.status_key: s.netns_path for s in runtime.sandboxes if s.netns_path and s.status_key}
    else:
        netns_map, first_seen = known, dict(state.sandbox_first_seen)
    new_state = State(history, first_seen, state.counters)  # the textfile's, carried
    if kept is not None:
        kept.state = new_state
        kept.sandbox_netns = netns_map
    try:
        save_state(settings.state_file, new_state)
    except StateError as err:
        warnings.append(f"{err}; confirmations will not carry to the next pass")
        return netns_map, False
    return netns_map, True


def _log_pass(
    log: logging.Logger,
    warnings: list[str],
    report: ScanReport,
    reachable: bool,
    seconds: float,
    timings: tuple[tuple[str, float], ...],
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
            "runtime_reachable": reachable,
            **{v: report.count(v) for v in VERDICTS},
            "stuck_sandboxes": len(report.stuck_sandboxes),
            "corrupt_files": sum(c.count for c in report.corrupt),
        },
    )
