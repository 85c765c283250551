"""Group the node's resources into attachments: (container ID, network, ifname). Pure.

Each kind says how its records tie (reaper.model's Tie); this module joins, in order: whole
keys, resources that know their container, pins by their namespace, the pins beside a netns pin,
namespaces a mount holds (with their pin, their owner, or alone), claims (what matches no
attachment is unconfirmed), then veths by where their peer lives (docs/design.md, "Finding")."""

from __future__ import annotations

from typing import Any

from msgspec import Struct

from reaper.kinds import Kind
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import (
    AttachmentKey,
    BesidePin,
    Claim,
    ContainerTie,
    HeldTie,
    NetnsTie,
    NodeSnapshot,
    NsKey,
    OwnKey,
    PeerTie,
    ResourceRef,
    RuntimeView,
    UnconfirmedResource,
    is_loopback,
)

# (container ID, network, ifname, pin path): tuples while grouping, AttachmentKey once done.
_Key = tuple[str | None, str | None, str | None, str | None]


class ResourceGroup(Struct, frozen=True, kw_only=True, gc=False):
    """Resources that belong to one attachment, before any verdict."""

    key: AttachmentKey
    resources: tuple[ResourceRef, ...]
    netns: NsKey | None
    foreign: bool  # a pin nothing names, whose name no runtime makes
    uninspectable_netns: str | None = None  # a netns path it names that cannot be inspected


def _primary_order(key: _Key) -> tuple[bool, bool, str, str]:
    return (is_loopback(key[1], key[2]), key[1] is None, key[2] or "~", key[1] or "")


class _Groups:
    def __init__(self) -> None:
        self.resources: dict[_Key, list[ResourceRef]] = {}
        self.netns: dict[_Key, NsKey] = {}
        self.by_cid: dict[str, list[_Key]] = {}

    def add(self, key: _Key, ref: ResourceRef) -> None:
        refs = self.resources.get(key)
        if refs is None:
            refs = self.resources[key] = []
            if key[0] is not None:
                self.by_cid.setdefault(key[0], []).append(key)
        refs.append(ref)

    def primary(self, cid: str, net: str | None) -> _Key:
        """The attachment of `cid` (on `net`, if given) that a partial resource joins."""
        return self.joined(cid, net) or (cid, net, None, None)

    def joined(self, cid: str, net: str | None) -> _Key | None:
        """The attachment of `cid` (on `net`, if given) a partial resource joins, if it has any."""
        keys = self.by_cid.get(cid)
        if keys is None:
            return None
        if net is not None:
            keys = [k for k in keys if k[1] == net]
        if len(keys) < 2:  # most containers have one attachment (a pod's lo is its second)
            return keys[0] if keys else None
        return min(keys, key=_primary_order)


class Ties(Struct, kw_only=True):
    """Every record's tie and its ref, by the way it joins; made from the snapshot alone."""

    own: list[tuple[OwnKey, ResourceRef]]
    container: list[tuple[ContainerTie, ResourceRef]]
    claims: list[tuple[Claim, ResourceRef, Kind[Any]]]
    pins: list[tuple[NetnsTie, ResourceRef]]
    veths: list[tuple[PeerTie, ResourceRef]]
    beside: list[tuple[BesidePin, ResourceRef]]
    held: list[tuple[HeldTie, ResourceRef]]

    def namespaces(self) -> set[NsKey]:
        """Every namespace a record ties itself to: each attachment's namespace is one of them."""
        named = {own.netns for own, _ in self.own if own.netns is not None}
        named.update(pin.ns for pin, _ in self.pins if pin.ns is not None)
        named.update(held.ns for held, _ in self.held)
        return named


class Correlation(Struct, frozen=True):
    groups: list[ResourceGroup]
    unconfirmed: list[UnconfirmedResource]


def tie_all(snapshot: NodeSnapshot, registry: Registry = REGISTRY) -> Ties:
    ties = Ties(own=[], container=[], claims=[], pins=[], veths=[], beside=[], held=[])
    for kind in registry.kinds:
        for record in snapshot.of(kind.name):
            tie = kind.tie(record)
            if tie is None:
                continue
            ref = kind.ref(record)
            if isinstance(tie, OwnKey):
                ties.own.append((tie, ref))
            elif isinstance(tie, ContainerTie):
                ties.container.append((tie, ref))
            elif isinstance(tie, Claim):
                ties.claims.append((tie, ref, kind))
            elif isinstance(tie, NetnsTie):
                ties.pins.append((tie, ref))
            elif isinstance(tie, BesidePin):
                ties.beside.append((tie, ref))
            elif isinstance(tie, HeldTie):
                ties.held.append((tie, ref))
            else:
                ties.veths.append((tie, ref))
    return ties


def _claim(claim: Claim, kind: Kind[Any], groups: _Groups, keyed: dict[str, dict[str, _Key]]) -> _Key | str:
    """The attachment a claim joins, or why it joins none."""
    if claim.key is not None:
        if kind.key_of is None:
            return f"{kind.name} carries a key, but the kind has no way to compute one"
        if kind.name not in keyed:
            keyed[kind.name] = {
                kind.key_of(k[0], k[1], k[2]): k for k in groups.resources if k[0] and k[1] and k[2] and not k[3]
            }
        found = keyed[kind.name].get(claim.key)
        return found if found is not None else f"its key {claim.key} is no attachment's on this node"
    cid = claim.container_id
    if cid is None:
        return "it names no owner of its own (its details say why)"
    joined = groups.joined(cid, claim.network)
    if joined is None:
        on = f" on {claim.network}" if claim.network else ""
        return f"container {str(cid)[:12]}{on} has no other resource on this node"
    return joined


def correlate(snapshot: NodeSnapshot, runtime: RuntimeView, registry: Registry = REGISTRY) -> Correlation:
    return join(tie_all(snapshot, registry), runtime)


def join(ties: Ties, runtime: RuntimeView) -> Correlation:
    """The attachments the ties make, given who the runtimes list."""
    groups = _Groups()
    uninspectable: dict[_Key, str] = {}
    for own, ref in ties.own:
        key: _Key = (own.container_id, own.network, own.ifname, None)
        groups.add(key, ref)
        if own.netns is not None:
            groups.netns.setdefault(key, own.netns)
        if own.uninspectable_netns is not None:
            uninspectable[key] = own.uninspectable_netns
    for part, ref in ties.container:
        groups.add(groups.primary(part.container_id, part.network), ref)

    # A pin joins the container its runtime lists it with, else the one a resource names: the
    # runtime first, so a forged cache entry naming a live pod's netns cannot take its pin.
    ns_owner: dict[NsKey, str] = {}
    for sandbox in sorted(runtime.sandboxes, key=lambda s: s.id):
        if sandbox.netns is not None:
            ns_owner.setdefault(sandbox.netns, sandbox.id)
    for own, _ in sorted(ties.own, key=lambda t: t[0].container_id):
        if own.netns is not None:
            ns_owner.setdefault(own.netns, own.container_id)

    pin_group: dict[NsKey, _Key] = {}
    pin_path_group: dict[str, _Key] = {}
    foreign: set[_Key] = set()
    for pin, ref in sorted(ties.pins, key=lambda t: t[0].path):
        owner = ns_owner.get(pin.ns) if pin.ns is not None else None
        key = groups.primary(owner, None) if owner is not None else (None, None, None, pin.path)
        if owner is None and not pin.runtime_named:
            foreign.add(key)
        groups.add(key, ref)
        pin_path_group[pin.path] = key
        if pin.ns is not None:
            groups.netns.setdefault(key, pin.ns)
            pin_group.setdefault(pin.ns, key)

    # A sandbox's other pins go where its netns pin went, by the name they share.
    unconfirmed: list[UnconfirmedResource] = []
    for beside, ref in ties.beside:
        target = pin_path_group.get(beside.netns_path)
        if target is None:
            unconfirmed.append(UnconfirmedResource(ref, f"no netns pin beside it at {beside.netns_path}"))
        else:
            groups.add(target, ref)

    # A namespace a mount holds joins its pin's attachment, else its owner's. One nothing else
    # names stands alone only with a host veth whose peer is in it (joined below): any process
    # that may mount makes namespaces, and those are no attachment (nor a count the breaker weighs).
    alone: dict[NsKey, tuple[HeldTie, ResourceRef]] = {}
    for held, ref in sorted(ties.held, key=lambda t: t[0].path):
        target = pin_group.get(held.ns)
        if target is None:
            owner = ns_owner.get(held.ns)
            if owner is None:
                alone.setdefault(held.ns, (held, ref))
                continue
            target = groups.primary(owner, None)
            groups.netns.setdefault(target, held.ns)
            pin_group[held.ns] = target
        groups.add(target, ref)

    # Claims join what the rest made: never an attachment of their own.
    keyed: dict[str, dict[str, _Key]] = {}
    for claim, ref, kind in ties.claims:
        joined = _claim(claim, kind, groups, keyed)
        if isinstance(joined, str):
            unconfirmed.append(UnconfirmedResource(ref, joined))
        else:
            groups.add(joined, ref)

    # A veth goes where its peer lives; a name proves nothing (some plugins name it after the pod).
    for veth, ref in ties.veths:
        if veth.peer_netns is not None and veth.peer_netns not in pin_group and veth.peer_netns in alone:
            held, held_ref = alone[veth.peer_netns]
            pin_group[held.ns] = (None, None, None, held.path)
            groups.add(pin_group[held.ns], held_ref)
            groups.netns[pin_group[held.ns]] = held.ns
        target = pin_group.get(veth.peer_netns) if veth.peer_netns is not None else None
        if target is not None:
            groups.add(target, ref)  # else its peer is in no pinned netns: not ours to judge

    ordered = [
        ResourceGroup(
            key=AttachmentKey(*key),
            resources=tuple(refs),
            netns=groups.netns.get(key),
            foreign=key in foreign,
            uninspectable_netns=uninspectable.get(key),
        )
        for key, refs in sorted(groups.resources.items(), key=lambda item: _sort_key(item[0]))
    ]
    return Correlation(ordered, unconfirmed)


def _sort_key(key: _Key) -> tuple[str, str, str, str]:
    return (key[0] or "", key[1] or "", key[2] or "", key[3] or "")
