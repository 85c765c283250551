"""The reaper's model: plain frozen records, no I/O: what exists on the node, what the runtimes
say is alive, what the reaper concluded and did. Only records that cross kinds live here; each
kind's own record type lives in its module under reaper.kinds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from msgspec import Struct

from reaper.exclusions import Exclusions

ResourceKind = str  # a kind's name, as reaper.kinds.registry lists them
# `waiting`: an orphan of only the files a plugin's DEL needs, which no DEL can run for.
Verdict = Literal["live", "orphan", "pending", "unknown", "excluded", "waiting"]
Owner = Literal["cri", "other", "unknown"]
VERDICTS: tuple[Verdict, ...] = ("live", "orphan", "pending", "unknown", "excluded", "waiting")

DetailValue = str | int | float | bool | None
# A resource's identity on the node, the same from one snapshot to the next: (kind, ...).
Identity = tuple[str, ...]


class NsKey(NamedTuple):
    """(st_dev, st_ino) of a network namespace's nsfs inode; a NamedTuple, as a dict key in every join hashes in C."""

    dev: int
    ino: int


class Holder(Struct, frozen=True, kw_only=True):
    """A process (or one of its threads) inside a network namespace."""

    pid: int
    comm: str
    is_cni_plugin: bool
    # A plugin this reaper started (its own DEL): the only process that does not make a netns busy.
    reapers_own: bool = False
    started_at: float = 0.0  # a plugin's, which with the pid says who it is; 0.0 for others

    @property
    def keeps_netns_busy(self) -> bool:
        return not self.reapers_own


class IpamRange(Struct, frozen=True):
    """How full one host-local range is: its size and the leases held in it."""

    network: str
    range: str
    size: int
    used: int


class HostLocalRange(Struct, frozen=True):
    """One host-local range from a network config, already given its defaults."""

    subnet: str
    start: str
    end: str
    gateway: str | None


class NetworkConfig(Struct, frozen=True, kw_only=True):
    """A network config file, or one a cache entry carries."""

    name: str
    path: str
    cni_version: str
    plugin_types: tuple[str, ...]
    ipam_data_dirs: tuple[str, ...]
    ipam_ranges: tuple[HostLocalRange, ...]
    disable_gc: bool
    raw: bytes
    # IP versions of host-local ranges whose subnet is the node's pod CIDR (usePodCidr: 4, usePodCidrIPv6: 6)
    pod_cidr_versions: tuple[int, ...] = ()

    @property
    def cached(self) -> bool:
        """Carried by a cache entry (reaper.kinds.cache), not one of the node's conf dirs."""
        return self.path.startswith("cache:")

    def __repr__(self) -> str:  # without raw: the whole file
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__struct_fields__ if name != "raw")
        return f"NetworkConfig({shown})"


class CorruptFile(Struct, frozen=True):
    """A file that is not what its place says it should be; reported, never acted on alone."""

    kind: str
    path: str
    error: str
    count: int = 1  # more than one: a line standing for that many files not listed one by one


class SourceError(Struct, frozen=True):
    """An inventory source that could not be read at all (a command missing or failing)."""

    source: str
    error: str


class HostUnseen(Exception):
    """Which network namespace is the host's cannot be told (not root, or not the host's /proc):
    no look can be made; one line for the operator, with the fix."""


class NodeSnapshot(Struct, frozen=True, kw_only=True):
    """One look at the node: every kind's records, and what could not be read."""

    taken_at: float
    host_netns: NsKey
    resources: Mapping[str, tuple[Any, ...]]
    ranges: tuple[IpamRange, ...]
    configs: tuple[NetworkConfig, ...]
    corrupt: tuple[CorruptFile, ...]
    errors: tuple[SourceError, ...]
    netns_pids: tuple[tuple[NsKey, tuple[int, ...]], ...] = ()  # every namespace but the host's a process is in
    # Those processes described, in the namespaces records tie to (reaper.snapshot.with_holders).
    netns_holders: tuple[tuple[NsKey, tuple[Holder, ...]], ...] = ()
    timings: tuple[tuple[str, float], ...] = ()  # seconds each collector took, in order
    unseen_processes: str | None = None  # why not every process could be seen; None: all were
    # Kinds this look could not read whole: a record of theirs it lacks may still be there.
    partly_read: frozenset[str] = frozenset()

    def of(self, kind: str) -> tuple[Any, ...]:
        return self.resources.get(kind, ())


class OwnKey(Struct, frozen=True, kw_only=True, gc=False):
    """A whole attachment key (container ID, network, ifname): an attachment of its own, in `netns` if it names one."""

    container_id: str
    network: str
    ifname: str
    netns: NsKey | None = None
    uninspectable_netns: str | None = None  # a netns path it names that cannot be inspected


class ContainerTie(Struct, frozen=True, gc=False):
    """A container ID (and perhaps a network), no ifname: it joins that container's primary attachment."""

    container_id: str
    network: str | None = None


class NetnsTie(Struct, frozen=True, gc=False):
    """A netns pin: it joins whoever owns its namespace, or stands alone."""

    ns: NsKey | None  # None: a stale file with no namespace on it
    path: str
    runtime_named: bool


class PeerTie(Struct, frozen=True, gc=False):
    """A host veth: it joins the attachment whose pinned namespace holds its peer, and no
    other (names repeat: some plugins name a veth after the pod, not the sandbox)."""

    name: str
    peer_netns: NsKey | None


class Claim(Struct, frozen=True, gc=False):
    """An owner's key that makes no attachment of its own (a container ID, a hash of one): it
    joins the attachment whose key matches, or stands `unconfirmed`, never reclaimed."""

    container_id: str | None = None
    network: str | None = None
    key: str | None = None  # the kind's own key of an attachment (its Kind.key_of)


class BesidePin(Struct, frozen=True, gc=False):
    """One of a sandbox's other pins, named as its netns pin (CRI-O's ipc, uts and user pins
    beside `<namespaces_dir>/netns/<uuid>`): it joins that pin's attachment, else unconfirmed."""

    netns_path: str


class HeldTie(Struct, frozen=True, gc=False):
    """A network namespace a mount holds outside the netns dirs: it joins its namespace's
    attachment, or stands alone, named by `path` (a way to it through a holder's root)."""

    ns: NsKey
    path: str


Tie = OwnKey | ContainerTie | Claim | NetnsTie | PeerTie | BesidePin | HeldTie


class Sandbox(Struct, frozen=True, kw_only=True):
    """A pod sandbox a runtime lists, READY or NOTREADY."""

    id: str
    name: str
    namespace: str
    uid: str
    ready: bool
    created_at: float | None  # epoch seconds; None when the runtime reports none
    netns_path: str | None  # what the runtime's PodSandboxStatus says, never a file's word
    netns: NsKey | None
    status_key: str = ""  # (sandbox ID, creation time): its netns path's memo key ("": none)
    runtime: str = ""  # the endpoint of the runtime that listed it ("": a source that names none)


class RuntimeAnswer(Struct, frozen=True, kw_only=True):
    """What one runtime on the node said this pass."""

    endpoint: str
    source: str  # where the endpoint was found: a flag, the kubelet, a known socket path
    name: str | None
    version: str | None
    reachable: bool
    error: str | None
    sandboxes: int
    skipped: bool = False  # a socket file nobody listens on: reported, not counted as a failure


class RuntimeView(Struct, frozen=True, kw_only=True):
    """What the runtimes said this pass, together. `reachable` False means nothing may be
    called orphan: some runtime that should have answered did not."""

    endpoint: str
    name: str | None
    version: str | None
    reachable: bool
    error: str | None
    sandboxes: tuple[Sandbox, ...]  # every sandbox any runtime lists
    runtimes: tuple[RuntimeAnswer, ...] = ()  # each runtime asked, and what it said


class ResourceRef(Struct, frozen=True, kw_only=True, gc=False):
    """A resource as an attachment lists it."""

    kind: ResourceKind
    name: str
    created_at: float | None  # None: the kernel keeps no timestamp for it
    # What the report shows of it, in order: a dict, so the report's object copies it whole.
    details: dict[str, DetailValue] = {}
    identity: Identity = ()  # its kind's identity of it: how a later look finds it again

    def detail(self, key: str) -> DetailValue:
        return self.details.get(key)


class AttachmentKey(Struct, frozen=True, order=True, gc=False):
    """(container ID, network, ifname); a pin tied to no container is keyed by its path."""

    container_id: str | None
    network: str | None
    ifname: str | None
    pin: str | None = None

    def as_text(self) -> str:
        if self.container_id is None:
            return f"netns:{self.pin}"
        return f"{self.container_id}/{self.network or ''}/{self.ifname or ''}"


LOOPBACK_NETWORK = "cni-loopback"  # the network containerd and CRI-O give a sandbox's lo


def is_loopback(network: str | None, ifname: str | None) -> bool:
    return ifname == "lo" or network == LOOPBACK_NETWORK


class Attachment(Struct, frozen=True, kw_only=True, gc=False):
    """The resources of one (container ID, network, ifname), with the verdict on them."""

    key: AttachmentKey
    resources: tuple[ResourceRef, ...]
    netns: NsKey | None
    verdict: Verdict
    reason: str
    age_seconds: float
    owner: Owner = "unknown"  # whose runtime made it, by its cache entry (see reaper.kinds.cache.CacheEntry.owner)
    pod: str | None = None  # "namespace/name", by its cache entry's CNI_ARGS (said by a file: names, never proves)
    waits_for: tuple[str, ...] = ()  # `waiting`: its chain's plugins that keep state, in order


class AttachmentHistory(Struct, frozen=True, gc=False):
    """What earlier passes saw of an attachment, for the grace rules."""

    first_seen: float
    orphan_streak: int  # consecutive passes on which it had no owner, counted at most one a spacing
    counted_at: float | None = None  # when the streak last rose (None: not since it was owned)


class Policy(Struct, frozen=True):
    """The grace rules, and what the operator keeps out of reach whatever it is."""

    min_age: float
    confirmations: int
    stuck_after: float
    exclusions: Exclusions = Exclusions()
    # A streak rises only this long after it last did (half of --interval): see docs/design.md.
    confirmation_spacing: float = 0.0


class StuckSandbox(Struct, frozen=True, kw_only=True):
    """A NOTREADY sandbox past --stuck-after: the runtime's to clean, reported only."""

    id: str
    name: str
    namespace: str
    age_seconds: float
    resources: tuple[ResourceRef, ...]


class ForeignPin(Struct, frozen=True):
    """A pin no runtime or cache entry names and whose name is not a runtime's: never touched."""

    name: str
    path: str
    holders: int


class UnconfirmedResource(Struct, frozen=True):
    """A resource whose key matches no attachment on the node: reported, never reclaimed."""

    resource: ResourceRef
    why: str


class ScanReport(Struct, frozen=True, kw_only=True):
    """Everything one read-only look concluded."""

    taken_at: float
    runtime: RuntimeView
    attachments: tuple[Attachment, ...]
    stuck_sandboxes: tuple[StuckSandbox, ...]
    corrupt: tuple[CorruptFile, ...]
    errors: tuple[SourceError, ...]
    ranges: tuple[IpamRange, ...]
    foreign_pins: tuple[ForeignPin, ...]
    unconfirmed: tuple[UnconfirmedResource, ...] = ()
    # The networks the node's conf dirs define (not cache entries'): the metrics' network labels.
    networks: tuple[str, ...] = ()

    def count(self, verdict: Verdict) -> int:
        return sum(1 for a in self.attachments if a.verdict == verdict)


ReclaimMethod = Literal["cni-del", "kernel", "quarantine"]
# undecided: a runtime could not be asked; breaker: too many orphans to act on; error: the pass failed.
PassOutcome = Literal["ok", "undecided", "breaker", "error"]
PASS_OUTCOMES: tuple[PassOutcome, ...] = ("ok", "undecided", "breaker", "error")


class PlannedStep(Struct, frozen=True):
    """How one resource of an orphan will be reclaimed."""

    kind: ResourceKind
    name: str
    method: ReclaimMethod


class PlannedAttachment(Struct, frozen=True):
    """How one orphan will be reclaimed, and where DEL takes its config from."""

    key: AttachmentKey
    config_source: str | None  # the cache file or conf file DEL takes its config from; None: kernel only
    steps: tuple[PlannedStep, ...]
    config_note: str | None = None  # why the cache entry's own config (or any plugin) does not run


class ResourceOutcome(Struct, frozen=True, kw_only=True):
    """What reclaiming did to one resource, as the look after it saw."""

    kind: ResourceKind
    name: str
    method: ReclaimMethod
    ok: bool
    error: str | None


class ReclaimOutcome(Struct, frozen=True):
    """What reclaiming did to one orphan."""

    key: AttachmentKey
    resources: tuple[ResourceOutcome, ...]
    plugin_errors: tuple[str, ...]  # every plugin whose DEL failed, and why
    # An IPAM plugin keeping its state off the node whose DEL failed or may not run: the cache
    # entry stays, as only that DEL, which needs it, releases the address.
    needs_plugin: str | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.resources)


class SkippedAttachment(Struct, frozen=True):
    """An orphan left this pass, and why."""

    key: AttachmentKey
    reason: str


class Done(Struct, frozen=True):
    """What one reclaiming action did to one resource: freed, or left and why."""

    ok: bool
    error: str | None = None
    quarantined: str | None = None  # where a file went instead of being deleted

    @staticmethod
    def freed() -> Done:
        return Done(ok=True)

    @staticmethod
    def moved(dest: str) -> Done:
        return Done(ok=True, quarantined=dest)

    @staticmethod
    def left(why: str) -> Done:
        return Done(ok=False, error=why)


class ScanResult(Struct, frozen=True, kw_only=True):
    """One read-only pass."""

    report: ScanReport
    snapshot: NodeSnapshot
    known_netns: Mapping[str, str]  # Sandbox.status_key -> netns path, as the runtime said
    state_saved: bool
    warnings: tuple[str, ...]
    seconds: float
    timings: tuple[tuple[str, float], ...]  # seconds per step of the pass
    # Container ID -> (pod namespace, name) of orphans in no namespace whose sandbox a runtime
    # listed to this process before and none lists now (reaper.runtime.listed): the agent's alone.
    gone_here: Mapping[str, tuple[str, str]] = {}

    @property
    def outcome(self) -> PassOutcome:
        return "ok" if self.report.runtime.reachable else "undecided"

    @property
    def problem(self) -> str | None:
        """Why the pass could not do its job, in one line; None when it could."""
        if not self.report.runtime.reachable:
            return f"runtime unreachable: {self.report.runtime.error}"
        return None


class ReapResult(Struct, frozen=True, kw_only=True):
    """One reclaiming pass: the scan it acted on, and what it did."""

    report: ScanReport
    breaker_open: bool
    breaker_reason: str | None
    plan: tuple[PlannedAttachment, ...]
    reclaimed: tuple[ReclaimOutcome, ...]
    skipped: tuple[SkippedAttachment, ...]
    recheck_error: str | None  # the runtime could not be asked again right before acting
    timings: tuple[tuple[str, float], ...] = ()  # seconds per step: scan, recheck, del, look, kernel, verify
    state_saved: bool = True

    @property
    def outcome(self) -> PassOutcome:
        if not self.report.runtime.reachable or self.recheck_error is not None:
            return "undecided"
        return "breaker" if self.breaker_open else "ok"

    @property
    def problem(self) -> str | None:
        """Why the pass could not do its job, in one line; None when it could."""
        if not self.report.runtime.reachable:
            return f"runtime unreachable: {self.report.runtime.error}"
        if self.recheck_error is not None:
            return f"runtime unreachable at a re-check, what was not yet reclaimed was left: {self.recheck_error}"
        if self.breaker_open:
            return f"breaker open: {self.breaker_reason}"
        return None
