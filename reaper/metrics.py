"""Prometheus metrics, named for what they count; one registry per process, no globals.

A `network` label's values come from files others can write (the conf dir, cache entries), and
each value is a series Prometheus keeps for as long as it is scraped: NetworkLabels bounds them,
so that a writer who makes a thousand networks makes no more series than the cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from reaper.host.atomic import write_atomically
from reaper.kinds import netconf
from reaper.kinds.registry import KIND_NAMES, LAST
from reaper.model import PASS_OUTCOMES, VERDICTS, Attachment, PassOutcome, ReapResult, ScanReport
from reaper.names import is_cni_id

PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
CORRUPT_KINDS = (*KIND_NAMES, netconf.CORRUPT_KIND)  # the kinds, and the network configs
METHODS = ("cni-del", "kernel", "quarantine")


PREFIX = "cni_reaper_"

# The network label: at most this many networks of the conf dirs by name, in a process's life;
# every other network counts under OTHER_NETWORK, an attachment with none (a lone netns pin)
# under NO_NETWORK. Neither can be a network's name: those start with a letter or digit.
MAX_NETWORK_LABELS = 32
OTHER_NETWORK = "_other"
NO_NETWORK = "_none"

# The `plugin` label of waiting attachments (the first plugin of the chain that keeps state):
# a stateful CNI by its plugin type, any other name (a config may say anything) under
# OTHER_PLUGIN. A `waiting` attachment is only files a DEL needs, so only the kinds of those
# (LAST) get a `resources{verdict="waiting"}` series.
WAITING_PLUGINS = frozenset(
    {
        "calico", "calico-ipam", "cilium-cni", "aws-cni", "kindnet", "multus", "multus-shim", "whereabouts",
        "dhcp", "ovn-k8s-cni-overlay", "azure-vnet", "antrea", "kube-ovn", "weave-net",
    }
)  # fmt: skip
OTHER_PLUGIN = "_other"


def _possible(kind: str, verdict: str) -> bool:
    return verdict != "waiting" or kind in LAST


def waiting_plugin(attachment: Attachment) -> str:
    """The `plugin` label of a waiting attachment."""
    first = attachment.waits_for[0] if attachment.waits_for else OTHER_PLUGIN
    return first if first in WAITING_PLUGINS else OTHER_PLUGIN


class NetworkLabels:
    """The `network` label value of each network: its own name while the conf dirs define it
    and it is one of the first MAX_NETWORK_LABELS names given out (in name order, pass by pass);
    OTHER_NETWORK for the rest. A name once given out keeps its place, so a series never
    changes meaning, and the values stay at most `cap` + 2 for as long as the process runs."""

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
    """A resource's age: since its own timestamp, else (the kernel keeps none: a veth) its
    attachment's age, as the report shows it."""
    return attachment.age_seconds if created_at is None else max(0.0, now - created_at)


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
            for kind in KIND_NAMES:
                if _possible(kind, verdict):
                    self.resources.labels(kind, verdict)
        for kind in KIND_NAMES:
            for method in METHODS:
                self.reclaimed.labels(kind, method)
                self.reclaim_errors.labels(kind, method)
        for corrupt_kind in CORRUPT_KINDS:
            self.corrupt.labels(corrupt_kind)
        for outcome in PASS_OUTCOMES:
            self.passes.labels(outcome)
        for kind in KIND_NAMES:
            self.oldest_orphan.labels(kind)
        self._network_series((OTHER_NETWORK, NO_NETWORK))

    def _network_series(self, labels: Iterable[str]) -> None:
        """Every series of the network metrics for these values, at 0 until counted: a counter
        that appears only at its first count hides that count from increase()."""
        for label in labels:
            self.network_orphans.labels(label)
            self.network_reclaimed.labels(label)
            self.network_del_errors.labels(label)

    def observe_scan(self, report: ScanReport) -> None:
        counts = {v: 0 for v in VERDICTS}
        per_kind = {(k, v): 0 for k in KIND_NAMES for v in VERDICTS if _possible(k, v)}
        waiting: dict[str, int] = {}
        for a in report.attachments:
            counts[a.verdict] += 1
            if a.verdict == "waiting":
                waiting[waiting_plugin(a)] = waiting.get(waiting_plugin(a), 0) + 1
            for ref in a.resources:
                per_kind[(ref.kind, a.verdict)] += 1
        # Only this pass's plugins: none waiting, no series.
        self.waiting.clear()
        for plugin, n in waiting.items():
            self.waiting.labels(plugin).set(n)
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
        self._observe_orphans(report)

    def _observe_orphans(self, report: ScanReport) -> None:
        named = self.networks.update(report.networks)
        self._network_series(named)
        oldest = dict.fromkeys(KIND_NAMES, 0.0)
        per_network = dict.fromkeys((*named, OTHER_NETWORK, NO_NETWORK), 0)
        for a in report.attachments:
            if a.verdict != "orphan":
                continue
            per_network[self.networks.of(a.key.network)] += 1
            for ref in a.resources:
                if ref.kind in oldest:
                    oldest[ref.kind] = max(oldest[ref.kind], _age(a, ref.created_at, report.taken_at))
        for kind, seconds in oldest.items():
            self.oldest_orphan.labels(kind).set(seconds)
        # Only this pass's values: a network gone from the conf dirs leaves no series behind.
        self.network_orphans.clear()
        for label, n in per_network.items():
            self.network_orphans.labels(label).set(n)

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
            network = self.networks.of(outcome.key.network)
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
        return generate_latest(self.registry)


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    """`name{label="value",...}`, labels in name order: how a counter sample is kept between runs."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class _Carried:
    """The registry as a textfile of one-shot runs shows it: each counter and histogram sample
    the sum of what earlier runs counted (`carried`) and this run's, so the series only grow
    from run to run, as increase() and rate() need. `_created` samples are left out: a run's
    own start is no counter's creation. `totals` holds the sums for the next run."""

    def __init__(self, registry: CollectorRegistry, carried: Mapping[str, float]) -> None:
        self.registry, self.carried = registry, carried
        self.totals: dict[str, float] = {}

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if family.type not in ("counter", "histogram"):
                yield family
                continue
            summed = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = sample_key(sample.name, sample.labels)
                value = sample.value + self.carried.get(key, 0.0)
                self.totals[key] = value
                summed.add_sample(sample.name, sample.labels, value, sample.timestamp, sample.exemplar)
            yield summed


def cumulative_exposition(registry: CollectorRegistry, carried: Mapping[str, float]) -> tuple[bytes, dict[str, float]]:
    """The exposition with earlier runs' counts added (see _Carried), and the new totals."""
    view = _Carried(registry, carried)
    return generate_latest(view), view.totals


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
