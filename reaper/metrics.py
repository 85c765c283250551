"""Prometheus metrics, named for what they count; one registry per process, no globals.

Only series that can mean something are exported: a counter's label pair exists at 0 before its
first count (or increase() would miss it) only where it can move, a gauge's appears once its
value first leaves 0, and no `_created` samples. The `network` label's values come from files
others can write, so NetworkLabels caps them. The rules in full: docs/reference.md, "Metrics in
full"."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from reaper.host.atomic import write_atomically
from reaper.kinds import Kind, heldns
from reaper.kinds.registry import REGISTRY
from reaper.model import (
    PASS_OUTCOMES,
    VERDICTS,
    Attachment,
    PassOutcome,
    ReapResult,
    ReclaimMethod,
    ScanReport,
)
from reaper.names import is_cni_id

PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

Mode = Literal["scan", "reap"]
# A kind seen in these gets its reclaim counters then, at least a pass before it can be freed.
RECLAIMABLE_VERDICTS = frozenset(("orphan", "pending"))


def reclaim_methods(kind: Kind[Any]) -> tuple[ReclaimMethod, ...]:
    """The methods that can free the kind's records, by what the kind says of itself: none for
    heldns (never freed), DEL if `del_frees`, the kernel, the quarantine if `quarantinable`."""
    if kind.name == heldns.NAME:
        return ()
    methods: list[ReclaimMethod] = ["cni-del"] if kind.del_frees else []
    methods.append("kernel")
    if kind.quarantinable:
        methods.append("quarantine")
    return tuple(methods)


METHODS_OF: dict[str, tuple[ReclaimMethod, ...]] = {k.name: reclaim_methods(k) for k in REGISTRY.kinds}
ORPHAN_KINDS: tuple[str, ...] = tuple(name for name, methods in METHODS_OF.items() if methods)


PREFIX = "cni_reaper_"

# At most this many conf-dir networks by name in a process's life; the rest count under
# OTHER_NETWORK, no network (a lone pin) under NO_NETWORK: no network's name starts with "_".
MAX_NETWORK_LABELS = 32
OTHER_NETWORK = "_other"
NO_NETWORK = "_none"

# The `plugin` label of waiting attachments: a stateful CNI by its type, any other name (a
# config may say anything) under OTHER_PLUGIN.
WAITING_PLUGINS = frozenset(
    {
        "calico", "calico-ipam", "cilium-cni", "aws-cni", "kindnet", "multus", "multus-shim", "whereabouts",
        "dhcp", "ovn-k8s-cni-overlay", "azure-vnet", "antrea", "kube-ovn", "weave-net",
    }
)  # fmt: skip
OTHER_PLUGIN = "_other"


def waiting_plugin(attachment: Attachment) -> str:
    """The `plugin` label of a waiting attachment."""
    first = attachment.waits_for[0] if attachment.waits_for else OTHER_PLUGIN
    return first if first in WAITING_PLUGINS else OTHER_PLUGIN


def installed_version() -> str:
    """The installed distribution's version (`reaper --version`); "unknown" from a bare tree."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("cni-reaper")
    except PackageNotFoundError:
        return "unknown"


class NetworkLabels:
    """The `network` label of each network: its name while the conf dirs define it and it is
    one of the first `cap` given out (in name order, pass by pass), else OTHER_NETWORK. A name
    given out keeps its place: at most `cap` + 2 values for the process's life."""

    def __init__(self, cap: int = MAX_NETWORK_LABELS) -> None:
        self._cap = cap
        self._given: dict[str, None] = {}  # in the order given out
        self._defined: frozenset[str] = frozenset()

    def update(self, conf_networks: Iterable[str]) -> tuple[str, ...]:
        """Take the conf dirs' networks of a pass; return the names given out that it defines."""
        self._defined = frozenset(n for n in conf_networks if is_cni_id(n))
        for name in sorted(self._defined):
            if len(self._given) >= self._cap:
                break
            self._given.setdefault(name)
        return tuple(n for n in self._given if n in self._defined)

    def of(self, network: str | None) -> str:
        if network is None:
            return NO_NETWORK
        return network if network in self._given and network in self._defined else OTHER_NETWORK


def _age(attachment: Attachment, created_at: float | None, now: float) -> float:
    """A resource's age: since its own timestamp, else (a veth) its attachment's."""
    return attachment.age_seconds if created_at is None else max(0.0, now - created_at)


def _gauge(registry: CollectorRegistry, name: str, text: str, *labels: str) -> Gauge:
    return Gauge(PREFIX + name, text, labels, registry=registry)


def _counter(registry: CollectorRegistry, name: str, text: str, *labels: str) -> prometheus_client.Counter:
    return prometheus_client.Counter(PREFIX + name, text, labels, registry=registry)


class _SeenGauge:
    """A labelled gauge whose label sets appear when their value first leaves 0, then stay."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._seen: set[tuple[str, ...]] = set()

    def set_all(self, values: Mapping[tuple[str, ...], float]) -> None:
        self._seen.update(labels for labels, n in values.items() if n)
        for labels in self._seen:
            self.gauge.labels(*labels).set(values.get(labels, 0))


class ReaperMetrics:
    def __init__(self, *, mode: Mode, version: str | None = None) -> None:
        """`mode`: what the observed passes do (`reap --dry-run` is a scan); see build_info."""
        self.mode = mode
        self.registry = r = CollectorRegistry()
        self.build_info = _gauge(
            r,
            "build_info",
            "1, labelled with the reaper's version and its mode (scan: report-only).",
            "version",
            "mode",
        )
        self.build_info.labels(installed_version() if version is None else version, mode).set(1)
        self.attachments = _gauge(r, "attachments", "Attachments seen on the last pass, by verdict.", "verdict")
        self.resources = _SeenGauge(
            _gauge(
                r,
                "resources",
                "Resources seen on the last pass, by kind and by the verdict of their attachment.",
                "kind",
                "verdict",
            )
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
        self.corrupt = _SeenGauge(_gauge(r, "corrupt_files", "Files the last pass could not read, by kind.", "kind"))
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
        self.breaker_open = _gauge(
            r,
            "breaker_open",
            "1 when the last pass refused to reclaim (too many orphans); in scan mode, when a reap would have.",
        )
        self.oldest_orphan = _gauge(
            r,
            "oldest_orphan_age_seconds",
            "Age of the oldest orphaned resource of each kind on the last pass (0: none).",
            "kind",
        )
        self.network_orphans = _gauge(
            r, "network_orphans", "Orphaned attachments on the last pass, by network (bounded, see README).", "network"
        )
        self.network_reclaimed = _counter(
            r, "network_reclaimed_attachments", "Orphaned attachments freed whole, by network.", "network"
        )
        self.network_del_errors = _counter(
            r, "network_del_errors", "Plugin DEL runs that failed, by network.", "network"
        )
        self.waiting = _gauge(
            r,
            "waiting_attachments",
            "Orphans no DEL can run for (verdict waiting), by the plugin that keeps their state (bounded).",
            "plugin",
        )
        self.networks = NetworkLabels()
        for verdict in VERDICTS:
            self.attachments.labels(verdict)
        for outcome in PASS_OUTCOMES:
            self.passes.labels(outcome)
        for kind in ORPHAN_KINDS:
            self.oldest_orphan.labels(kind)

    def _expect_reclaims(self, report: ScanReport) -> None:
        """In reap mode, the reclaim counters a reclaim may soon count, at 0 until it does."""
        if self.mode != "reap":
            return
        for a in report.attachments:
            if a.verdict not in RECLAIMABLE_VERDICTS:
                continue
            for ref in a.resources:
                for method in METHODS_OF.get(ref.kind, ()):
                    self.reclaimed.labels(ref.kind, method)
                    self.reclaim_errors.labels(ref.kind, method)
            label = self.networks.of(a.key.network)
            self.network_reclaimed.labels(label)
            self.network_del_errors.labels(label)

    def observe_scan(self, report: ScanReport) -> None:
        attachments = report.attachments
        counts = Counter(a.verdict for a in attachments)
        # Only this pass's plugins: none waiting, no series.
        self.waiting.clear()
        for plugin, n in Counter(waiting_plugin(a) for a in attachments if a.verdict == "waiting").items():
            self.waiting.labels(plugin).set(n)
        for verdict in VERDICTS:
            self.attachments.labels(verdict).set(counts[verdict])
        per_kind: Counter[tuple[str, ...]] = Counter((ref.kind, a.verdict) for a in attachments for ref in a.resources)
        self.resources.set_all(per_kind)
        self.range_size.clear()
        self.range_used.clear()
        for r in report.ranges:
            self.range_size.labels(r.network, r.range).set(r.size)
            self.range_used.labels(r.network, r.range).set(r.used)
        self.stuck.set(len(report.stuck_sandboxes))
        corrupt: Counter[tuple[str, ...]] = Counter()
        for c in report.corrupt:
            corrupt[(c.kind,)] += c.count
        self.corrupt.set_all(corrupt)
        self.runtime_up.set(1 if report.runtime.reachable else 0)
        self._observe_orphans(report)
        self._expect_reclaims(report)

    def _observe_orphans(self, report: ScanReport) -> None:
        self.networks.update(report.networks)
        oldest = dict.fromkeys(ORPHAN_KINDS, 0.0)
        per_network: Counter[str] = Counter()
        for a in report.attachments:
            if a.verdict != "orphan":
                continue
            per_network[self.networks.of(a.key.network)] += 1
            for ref in a.resources:
                if ref.kind in oldest:
                    oldest[ref.kind] = max(oldest[ref.kind], _age(a, ref.created_at, report.taken_at))
        for kind, seconds in oldest.items():
            self.oldest_orphan.labels(kind).set(seconds)
        # Only this pass's networks with orphans: absent reads as 0.
        self.network_orphans.clear()
        for label, n in per_network.items():
            self.network_orphans.labels(label).set(n)

    def observe_state(self, saved: bool) -> None:
        if not saved:
            self.state_write_errors.inc()

    def observe_breaker(self, tripped: bool) -> None:
        """Whether the breaker stopped this pass's reclaim; in scan mode, whether it would have."""
        self.breaker_open.set(1 if tripped else 0)

    def observe_reap(self, result: ReapResult) -> None:
        self.observe_scan(result.report)
        self.observe_state(result.state_saved)
        self.observe_breaker(result.breaker_open)
        for outcome in result.reclaimed:
            for r in outcome.resources:
                (self.reclaimed if r.ok else self.reclaim_errors).labels(r.kind, r.method).inc()
            self.plugin_errors.inc(len(outcome.plugin_errors))
            network = self.networks.of(outcome.key.network)
            if outcome.plugin_errors:
                self.network_del_errors.labels(network).inc(len(outcome.plugin_errors))
            if outcome.ok:
                self.network_reclaimed.labels(network).inc()
        self.skipped.inc(len(result.skipped))

    def observe_pass(self, seconds: float, outcome: PassOutcome, finished_at: float) -> None:
        self.pass_duration.observe(seconds)
        self.passes.labels(outcome).inc()
        if outcome in ("ok", "breaker"):
            self.last_success.set(finished_at)

    def exposition(self) -> bytes:
        return generate_latest(_Exposed(self.registry))


class _Exposed:
    """The registry without `_created` samples (a series per counter no alert reads);
    prometheus_client's disable_created_metrics() would set it for every registry at once."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if family.type not in ("counter", "histogram", "gauge_histogram"):
                yield family
                continue
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield kept


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    """`name{label="value",...}`, labels in name order: how a counter sample is kept between runs."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


_SAMPLE_KEY = re.compile(r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?")
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def parse_sample_key(key: str) -> tuple[str, dict[str, str]] | None:
    """The name and labels of a key sample_key made (its label values never hold a quote: kinds,
    methods, outcomes, CNI names); None for anything else."""
    match = _SAMPLE_KEY.fullmatch(key)
    if match is None:
        return None
    text = match.group("labels")
    labels = dict(_LABEL_PAIR.findall(text)) if text else {}
    if sample_key(match.group("name"), labels) != key:
        return None
    return match.group("name"), labels


class _Carried:
    """The registry as one-shots' textfile shows it: each counter and histogram sample summed
    with earlier runs' (`carried`), so series only grow; a carried counter sample this run did
    not make is written on. No `_created` samples. `totals`: the sums for the next run."""

    def __init__(self, registry: CollectorRegistry, carried: Mapping[str, float]) -> None:
        self.registry, self.carried = registry, carried
        self.totals: dict[str, float] = {}

    def collect(self) -> Iterator[Metric]:
        for family in _Exposed(self.registry).collect():
            if family.type not in ("counter", "histogram"):
                yield family
                continue
            summed = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                key = sample_key(sample.name, sample.labels)
                value = sample.value + self.carried.get(key, 0.0)
                self.totals[key] = value
                summed.add_sample(sample.name, sample.labels, value, sample.timestamp, sample.exemplar)
            if family.type == "counter":
                for key, value in sorted(self.carried.items()):
                    parsed = parse_sample_key(key)
                    if parsed is None or parsed[0] != family.name + "_total" or key in self.totals:
                        continue
                    self.totals[key] = value
                    summed.add_sample(parsed[0], parsed[1], value)
            yield summed


def cumulative_exposition(registry: CollectorRegistry, carried: Mapping[str, float]) -> tuple[bytes, dict[str, float]]:
    """The exposition with earlier runs' counts added (see _Carried), and the new totals."""
    view = _Carried(registry, carried)
    return generate_latest(view), view.totals


class TextfileError(OSError):
    pass


def write_textfile(path: str, data: bytes) -> None:
    """Atomically replace `path` (node_exporter's textfile), mode 0644: a symlink planted there
    is replaced, never written through."""
    try:
        write_atomically(path, data, 0o644)
    except OSError as err:
        raise TextfileError(err.errno, f"cannot write textfile {path}: {err.strerror}") from None
