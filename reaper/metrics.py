"""Prometheus metrics, named for what they count; one registry per process, no globals."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from reaper.host.atomic import write_atomically
from reaper.kinds import netconf
from reaper.kinds.registry import KIND_NAMES
from reaper.model import PASS_OUTCOMES, VERDICTS, PassOutcome, ReapResult, ScanReport

PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
CORRUPT_KINDS = (*KIND_NAMES, netconf.CORRUPT_KIND)  # the kinds, and the network configs
METHODS = ("cni-del", "kernel", "quarantine")


PREFIX = "cni_reaper_"


def _gauge(registry: CollectorRegistry, name: str, text: str, *labels: str) -> Gauge:
    return Gauge(PREFIX + name, text, labels, registry=registry)


def _counter(registry: CollectorRegistry, name: str, text: str, *labels: str) -> Counter:
    return Counter(PREFIX + name, text, labels, registry=registry)


class ReaperMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.attachments = _gauge(r, "attachments", "Attachments seen on the last pass, by verdict.", "verdict")
        self.resources = _gauge(
            r,
            "resources",
            "Resources seen on the last pass, by kind and by the verdict of their attachment.",
            "kind",
            "verdict",
        )
        self.reclaimed = _counter(r, "reclaimed", "Resources freed, by kind and method.", "kind", "method")
        self.reclaim_errors = _counter(
            r, "reclaim_errors", "Resources an attempt to free left behind, by kind and method.", "kind", "method"
        )
        self.plugin_errors = _counter(
            r, "plugin_del_errors", "Plugin DEL runs that failed (the kernel path then takes over)."
        )
        self.skipped = _counter(
            r,
            "skipped_attachments",
            "Orphans left for a later pass: over --max-reap, listed again at the re-check, runtime unreachable.",
        )
        self.range_size = _gauge(r, "ipam_range_size", "Addresses a host-local range can give out.", "network", "range")
        self.range_used = _gauge(r, "ipam_range_used", "Leases held in a host-local range.", "network", "range")
        self.stuck = _gauge(r, "stuck_sandboxes", "NOTREADY sandboxes older than --stuck-after (the runtime's).")
        self.corrupt = _gauge(r, "corrupt_files", "Files the last pass could not read, by kind.", "kind")
        self.pass_duration = Histogram(
            PREFIX + "pass_duration_seconds", "Wall time of a whole pass.", buckets=PASS_BUCKETS, registry=r
        )
        self.last_success = _gauge(
            r,
            "last_pass_success_timestamp_seconds",
            "When a pass last finished with the runtime reachable (Unix time).",
        )
        self.passes = _counter(r, "passes", "Passes run, by outcome.", "outcome")
        self.state_write_errors = _counter(
            r, "state_write_errors", "Passes whose state file could not be written (confirmations then start over)."
        )
        self.runtime_up = _gauge(r, "runtime_up", "1 when the runtime answered on the last pass.")
        self.breaker_open = _gauge(r, "breaker_open", "1 when the last pass refused to reclaim (too many orphans).")
        for verdict in VERDICTS:
            self.attachments.labels(verdict)
            for kind in KIND_NAMES:
                self.resources.labels(kind, verdict)
        for kind in KIND_NAMES:
            for method in METHODS:
                self.reclaimed.labels(kind, method)
                self.reclaim_errors.labels(kind, method)
        for corrupt_kind in CORRUPT_KINDS:
            self.corrupt.labels(corrupt_kind)
        for outcome in PASS_OUTCOMES:
            self.passes.labels(outcome)

    def observe_scan(self, report: ScanReport) -> None:
        counts = {v: 0 for v in VERDICTS}
        per_kind = {(k, v): 0 for k in KIND_NAMES for v in VERDICTS}
        for a in report.attachments:
            counts[a.verdict] += 1
            for ref in a.resources:
                per_kind[(ref.kind, a.verdict)] += 1
        for verdict, n in counts.items():
            self.attachments.labels(verdict).set(n)
        for (kind, verdict), n in per_kind.items():
            self.resources.labels(kind, verdict).set(n)
        self.range_size.clear()
        self.range_used.clear()
        for r in report.ranges:
            self.range_size.labels(r.network, r.range).set(r.size)
            self.range_used.labels(r.network, r.range).set(r.used)
        self.stuck.set(len(report.stuck_sandboxes))
        corrupt = dict.fromkeys(CORRUPT_KINDS, 0)
        for c in report.corrupt:
            corrupt[c.kind] = corrupt.get(c.kind, 0) + c.count
        for file_kind, n in corrupt.items():
            self.corrupt.labels(file_kind).set(n)
        self.runtime_up.set(1 if report.runtime.reachable else 0)

    def observe_state(self, saved: bool) -> None:
        if not saved:
            self.state_write_errors.inc()

    def observe_reap(self, result: ReapResult) -> None:
        self.observe_scan(result.report)
        self.observe_state(result.state_saved)
        self.breaker_open.set(1 if result.breaker_open else 0)
        for outcome in result.reclaimed:
            for r in outcome.resources:
                (self.reclaimed if r.ok else self.reclaim_errors).labels(r.kind, r.method).inc()
            self.plugin_errors.inc(len(outcome.plugin_errors))
        self.skipped.inc(len(result.skipped))

    def observe_pass(self, seconds: float, outcome: PassOutcome, finished_at: float) -> None:
        self.pass_duration.observe(seconds)
        self.passes.labels(outcome).inc()
        if outcome in ("ok", "breaker"):
            self.last_success.set(finished_at)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class TextfileError(OSError):
    pass


def write_textfile(path: str, data: bytes) -> None:
    """Atomically replace `path` (for node_exporter's textfile collector), mode 0644.

    The temp file is created exclusively in the same dir and renamed over the target, so a
    symlink planted at `path` is replaced, never written through.
    """
    try:
        write_atomically(path, data, 0o644)
    except OSError as err:
        raise TextfileError(err.errno, f"cannot write textfile {path}: {err.strerror}") from None
