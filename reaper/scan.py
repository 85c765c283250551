"""One read-only pass: inventory, then liveness, then reconcile; confirmations kept in the state file.

A one-shot run (a timer's `reaper scan` or `reaper reap`) reads every file afresh: it keeps no
memo of parsed files on disk. A memo there was an input whoever writes the state dir could
shape (a cache entry's netns taken away made a running container's attachment an orphan,
issue 23); the state file alone carries from run to run, and it holds no evidence. A
`<state file>.memo` an older version left is never read, written or removed: it is inert.
The long-running agent keeps its memo in memory, where no one else writes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from msgspec.structs import replace

from reaper.correlate import join, tie_all
from reaper.host.memo import InventoryMemo
from reaper.kinds import FindOptions
from reaper.model import VERDICTS, ScanResult
from reaper.reconcile import holders_decide, processes_decide, reconcile
from reaper.runtime.liveness import LivenessSource
from reaper.settings import Settings
from reaper.snapshot import take_snapshot, with_holders, with_processes
from reaper.state import KeptState, State, StateError, load_state, save_state


def find_options(settings: Settings) -> FindOptions:
    return FindOptions(
        netns_dirs=settings.netns_dirs,
        ipam_dirs=settings.ipam_dirs,
        cache_dir=settings.cni_cache_dir,
        conf_dir=settings.cni_conf_dir,
        bin_dirs=settings.cni_bin_dirs,
        netns_patterns=settings.netns_patterns,
        pod_cidrs=settings.pod_cidrs,
    )


def scan_pass(
    settings: Settings,
    liveness: LivenessSource,
    log: logging.Logger,
    clock: Callable[[], float] = time.time,
    memo: InventoryMemo | None = None,
    kept: KeptState | None = None,
) -> ScanResult:
    """One pass. A long-running caller passes the same `memo` every time (files unchanged
    since the last pass are not read again); a one-shot run passes none and reads every file.
    `kept`: a long-running caller's state of its last pass, counted from instead of the file
    once it holds one (see reaper.state)."""
    return _scan_pass(settings, liveness, log, clock, memo, kept)


def _scan_pass(
    settings: Settings,
    liveness: LivenessSource,
    log: logging.Logger,
    clock: Callable[[], float],
    memo: InventoryMemo | None,
    kept: KeptState | None,
) -> ScanResult:
    started = time.monotonic()
    warnings: list[str] = []
    if kept is not None and kept.state is not None:
        state = kept.state
    else:
        state, warning = load_state(settings.state_file)
        if warning:
            warnings.append(warning)
    options = find_options(settings)
    # The node first, the runtime second: a sandbox born in between is then newer than
    # anything in the snapshot that could be mistaken for one of its resources.
    memo = memo if memo is not None else InventoryMemo()  # a one-shot's: this pass only
    snapshot = take_snapshot(options, memo)
    mark = time.monotonic()
    # What PodSandboxStatus said before, by (sandbox ID, creation time): never a cache entry's word.
    known = dict(state.sandbox_netns)
    runtime = liveness.observe(known)
    liveness_s = time.monotonic() - mark
    mark = time.monotonic()
    ties = tie_all(snapshot)
    ties_s = time.monotonic() - mark
    now = clock()
    first_seen = {s.id: state.sandbox_first_seen.get(s.id, now) for s in runtime.sandboxes if s.created_at is None}
    runtime = replace(
        runtime,
        sandboxes=tuple(
            s if s.created_at is not None else replace(s, created_at=first_seen[s.id]) for s in runtime.sandboxes
        ),
    )
    # Who is in each namespace is evidence of use, as the runtimes' list is: read after it, and
    # only when it can decide a verdict.
    mark = time.monotonic()
    correlation = join(ties, runtime)
    reconcile_s = time.monotonic() - mark
    mark = time.monotonic()
    if processes_decide(ties.namespaces(), runtime):
        snapshot = with_processes(snapshot)
    processes_s = time.monotonic() - mark
    mark = time.monotonic()
    snapshot = with_holders(snapshot, holders_decide(correlation, runtime), settings.cni_bin_dirs)
    holders_s = time.monotonic() - mark
    mark = time.monotonic()
    report, history = reconcile(snapshot, runtime, state.attachments, settings.policy, now, correlation)
    reconcile_s += time.monotonic() - mark
    mark = time.monotonic()
    if runtime.reachable:
        netns_map = {s.status_key: s.netns_path for s in runtime.sandboxes if s.netns_path and s.status_key}
    else:
        netns_map, first_seen = dict(state.sandbox_netns), dict(state.sandbox_first_seen)
    state_saved = True
    new_state = State(history, netns_map, first_seen)
    if kept is not None:
        kept.state = new_state
    try:
        save_state(settings.state_file, new_state)
    except StateError as err:
        state_saved = False
        warnings.append(f"{err}; confirmations will not carry to the next pass")
    timings = (
        *snapshot.timings,
        ("ties", round(ties_s, 6)),
        ("liveness", round(liveness_s, 6)),
        ("processes", round(processes_s, 6)),
        ("holders", round(holders_s, 6)),
        ("reconcile", round(reconcile_s, 6)),
        ("state", round(time.monotonic() - mark, 6)),
    )
    for text in warnings:
        log.warning(text)
    for failure in report.errors:
        log.warning("inventory source failed", extra={"source": failure.source, "error": failure.error})
    seconds = time.monotonic() - started
    log.debug("pass timings", extra=dict(timings))
    log.debug(
        "scan pass",
        extra={
            "seconds": round(seconds, 3),
            "runtime_reachable": runtime.reachable,
            **{v: report.count(v) for v in VERDICTS},
            "stuck_sandboxes": len(report.stuck_sandboxes),
            "corrupt_files": sum(c.count for c in report.corrupt),
        },
    )
    return ScanResult(
        report, snapshot, netns_map if runtime.reachable else known, state_saved, tuple(warnings), seconds, timings
    )
