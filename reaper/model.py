"""The reaper's model: plain frozen records, no I/O.

Inventory records say what exists on the node, liveness records what the runtime
says is alive, and the reconcile records what the reaper concluded and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

ResourceKind = Literal["netns", "veth", "ipam", "cache", "iptables", "nft"]
Verdict = Literal["live", "orphan", "pending", "unknown"]
VERDICTS: tuple[Verdict, ...] = ("live", "orphan", "pending", "unknown")
RESOURCE_KINDS: tuple[ResourceKind, ...] = ("netns", "veth", "ipam", "cache", "iptables", "nft")

DetailValue = str | int | float | bool | None


class NsKey(NamedTuple):
    """Identity of a network namespace: (st_dev, st_ino) of its nsfs inode.

    A NamedTuple rather than a dataclass: it is a dict key in every join, hashed tens of
    thousands of times a pass, and a tuple hashes in C.
    """

    dev: int
    ino: int


# ---------------------------------------------------------------- inventory


@dataclass(frozen=True)
class Holder:
    """A process (or one of its threads) inside a network namespace."""

    pid: int
    comm: str
    is_cni_plugin: bool
    # A plugin this reaper started (its own DEL): the only process that does not make a netns
    # busy. A plugin someone else started is an ADD or DEL of the runtime's, in progress.
    reapers_own: bool = False

    @property
    def keeps_netns_busy(self) -> bool:
        return not self.reapers_own


@dataclass(frozen=True)
class NetnsPin:
    """A file under a netns dir, normally a bind mount of a network namespace."""

    name: str
    path: str
    directory: str
    ns: NsKey
    is_namespace: bool  # False: a stale plain file, no namespace mounted on it
    mtime: float
    holders: tuple[Holder, ...]
    runtime_named: bool  # the name is one a container runtime makes


@dataclass(frozen=True)
class VethLink:
    """A veth in the netns the reaper runs in (the host side of a pod's pair)."""

    ifindex: int
    name: str
    peer_ifindex: int | None
    peer_netnsid: int | None
    master: str | None
    peer_netns: NsKey | None  # the pinned namespace the peer lives in, when known


@dataclass(frozen=True)
class HostLocalLease:
    """One host-local IPAM allocation file: `<data dir>/<network>/<ip>`."""

    network: str
    ip: str
    container_id: str
    ifname: str | None  # None in the legacy one-line format
    path: str
    data_dir: str
    mtime: float


@dataclass(frozen=True)
class IpamRange:
    network: str
    range: str
    size: int
    used: int


@dataclass(frozen=True)
class CacheEntry:
    """A libcni result cache file."""

    path: str
    name: str
    container_id: str
    network: str
    ifname: str
    netns_path: str | None
    netns: NsKey | None
    host_ifnames: tuple[str, ...]
    legacy: bool  # a bare pre-0.8 result with no `kind`
    mtime: float
    # Why the file could not be read, when its name alone ties it to an attachment (a zero-byte
    # or truncated file left by a crash: libcni then fails DEL, so it leaks for good).
    corrupt: str | None = None
    # Its netns path exists but cannot be inspected (a protected /proc/<pid>/ns/net).
    netns_uninspectable: bool = False


@dataclass(frozen=True)
class IptablesChain:
    """A per-attachment nat chain a CNI plugin made, and the rules that jump to it."""

    family: Literal["ipv4", "ipv6"]
    table: str
    chain: str
    purpose: Literal["masquerade", "hostport-dnat", "hostport-snat"]
    network: str | None
    container_id: str | None
    rules: tuple[str, ...]  # its own rules, as iptables-save prints them
    jumps: tuple[str, ...]  # rules in other chains that jump to it
    backend: str = "default"  # iptables "nft" or "legacy" (or "default" when only one exists)


@dataclass(frozen=True)
class NftRule:
    family: str
    table: str
    chain: str
    handle: int
    network: str | None
    ifname: str | None
    container_id: str


@dataclass(frozen=True)
class HostLocalRange:
    """One host-local range from a network config, already given its defaults."""

    subnet: str
    start: str
    end: str
    gateway: str | None


@dataclass(frozen=True)
class NetworkConfig:
    """A network config file, or one a cache entry carries."""

    name: str
    path: str
    cni_version: str
    plugin_types: tuple[str, ...]
    ipam_data_dirs: tuple[str, ...]
    ipam_ranges: tuple[HostLocalRange, ...]
    disable_gc: bool
    raw: bytes = field(repr=False)


@dataclass(frozen=True)
class CorruptFile:
    kind: str
    path: str
    error: str


@dataclass(frozen=True)
class SourceError:
    """An inventory source that could not be read at all (a command missing or failing)."""

    source: str
    error: str


@dataclass(frozen=True)
class NodeSnapshot:
    taken_at: float
    host_netns: NsKey
    pins: tuple[NetnsPin, ...]
    veths: tuple[VethLink, ...]
    leases: tuple[HostLocalLease, ...]
    ranges: tuple[IpamRange, ...]
    cache_entries: tuple[CacheEntry, ...]
    chains: tuple[IptablesChain, ...]
    nft_rules: tuple[NftRule, ...]
    configs: tuple[NetworkConfig, ...]
    corrupt: tuple[CorruptFile, ...]
    errors: tuple[SourceError, ...]
    # Every namespace but the host's that some process is in, with those processes.
    netns_holders: tuple[tuple[NsKey, tuple[Holder, ...]], ...] = ()
    # Seconds each collector took, in order: where a pass's time goes.
    timings: tuple[tuple[str, float], ...] = ()


# ----------------------------------------------------------------- liveness


@dataclass(frozen=True)
class Sandbox:
    id: str
    name: str
    namespace: str
    uid: str
    ready: bool
    created_at: float | None  # epoch seconds; None when the runtime reports none
    netns_path: str | None
    netns: NsKey | None


@dataclass(frozen=True)
class RuntimeView:
    """What the runtime said this pass. `reachable` False means nothing may be called orphan."""

    endpoint: str
    name: str | None
    version: str | None
    reachable: bool
    error: str | None
    sandboxes: tuple[Sandbox, ...]


# ---------------------------------------------------------------- reconcile


@dataclass(frozen=True)
class ResourceRef:
    kind: ResourceKind
    name: str
    created_at: float | None  # None: the kernel keeps no timestamp for it
    details: tuple[tuple[str, DetailValue], ...] = ()


@dataclass(frozen=True, order=True)
class AttachmentKey:
    """(container ID, network, ifname); a pin tied to no container is keyed by its path."""

    container_id: str | None
    network: str | None
    ifname: str | None
    pin: str | None = None

    def as_text(self) -> str:
        if self.container_id is None:
            return f"netns:{self.pin}"
        return f"{self.container_id}/{self.network or ''}/{self.ifname or ''}"


@dataclass(frozen=True)
class Attachment:
    key: AttachmentKey
    resources: tuple[ResourceRef, ...]
    netns: NsKey | None
    verdict: Verdict
    reason: str
    age_seconds: float


@dataclass(frozen=True)
class AttachmentHistory:
    first_seen: float
    orphan_streak: int  # consecutive passes on which it had no owner


@dataclass(frozen=True)
class Policy:
    min_age: float
    confirmations: int
    stuck_after: float


@dataclass(frozen=True)
class StuckSandbox:
    id: str
    name: str
    namespace: str
    age_seconds: float
    resources: tuple[ResourceRef, ...]


@dataclass(frozen=True)
class ForeignPin:
    """A pin no runtime or cache entry names and whose name is not a runtime's: never touched."""

    name: str
    path: str
    holders: int


@dataclass(frozen=True)
class ScanReport:
    taken_at: float
    runtime: RuntimeView
    attachments: tuple[Attachment, ...]
    stuck_sandboxes: tuple[StuckSandbox, ...]
    corrupt: tuple[CorruptFile, ...]
    errors: tuple[SourceError, ...]
    ranges: tuple[IpamRange, ...]
    foreign_pins: tuple[ForeignPin, ...]

    def count(self, verdict: Verdict) -> int:
        return sum(1 for a in self.attachments if a.verdict == verdict)


# ------------------------------------------------------------------ reclaim

ReclaimMethod = Literal["cni-del", "kernel", "quarantine"]


@dataclass(frozen=True)
class PlannedStep:
    kind: ResourceKind
    name: str
    method: ReclaimMethod


@dataclass(frozen=True)
class PlannedAttachment:
    key: AttachmentKey
    config_source: str | None  # the cache file or conf file DEL takes its config from; None: kernel only
    steps: tuple[PlannedStep, ...]


@dataclass(frozen=True)
class ResourceOutcome:
    kind: ResourceKind
    name: str
    method: ReclaimMethod
    ok: bool
    error: str | None


@dataclass(frozen=True)
class ReclaimOutcome:
    key: AttachmentKey
    resources: tuple[ResourceOutcome, ...]
    plugin_errors: tuple[str, ...]  # every plugin whose DEL failed, and why

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.resources)


@dataclass(frozen=True)
class SkippedAttachment:
    key: AttachmentKey
    reason: str


@dataclass(frozen=True)
class GcOutcome:
    network: str
    plugin: str
    ok: bool
    error: str | None
