"""Group the node's resources into attachments: (container ID, network, ifname). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from reaper.model import (
    AttachmentKey,
    NetnsPin,
    NodeSnapshot,
    NsKey,
    ResourceRef,
    RuntimeView,
)


@dataclass(frozen=True)
class ResourceGroup:
    """Resources that belong to one attachment, before any verdict."""

    key: AttachmentKey
    resources: tuple[ResourceRef, ...]
    netns: NsKey | None
    foreign: bool  # a pin nothing names, whose name no runtime makes


@dataclass
class _Builder:
    key: AttachmentKey
    resources: list[ResourceRef] = field(default_factory=list)
    netns: NsKey | None = None
    pin: NetnsPin | None = None


def _primary_order(key: AttachmentKey) -> tuple[bool, bool, str, str]:
    loopback = key.ifname == "lo" or key.network == "cni-loopback"
    return (loopback, key.network is None, key.ifname or "~", key.network or "")


def pin_ref(pin: NetnsPin) -> ResourceRef:
    details: list[tuple[str, str | int | float | bool | None]] = [("path", pin.path)]
    if not pin.is_namespace:
        details.append(("stale", True))
    if pin.holders:
        details.append(("pids", ",".join(str(h.pid) for h in pin.holders)))
    return ResourceRef("netns", pin.name, pin.mtime, tuple(details))


def correlate(snapshot: NodeSnapshot, runtime: RuntimeView) -> list[ResourceGroup]:
    groups: dict[AttachmentKey, _Builder] = {}
    by_cid: dict[str, list[AttachmentKey]] = {}

    def group(cid: str | None, net: str | None, ifname: str | None, pin: str | None = None) -> _Builder:
        key = AttachmentKey(cid, net, ifname, pin)
        if key not in groups:
            groups[key] = _Builder(key)
            if cid is not None:
                by_cid.setdefault(cid, []).append(key)
        return groups[key]

    veth_owner: dict[str, AttachmentKey] = {}
    for entry in snapshot.cache_entries:
        b = group(entry.container_id, entry.network, entry.ifname)
        b.resources.append(
            ResourceRef("cache", entry.name, entry.mtime, (("path", entry.path), ("legacy", entry.legacy)))
        )
        if entry.netns is not None and b.netns is None:
            b.netns = entry.netns
        for ifname in entry.host_ifnames:
            veth_owner.setdefault(ifname, b.key)

    partial: list[tuple[str, str | None, ResourceRef]] = []
    for lease in snapshot.leases:
        ref = ResourceRef("ipam", f"{lease.network}/{lease.ip}", lease.mtime, (("path", lease.path), ("ip", lease.ip)))
        if lease.ifname is None:
            partial.append((lease.container_id, lease.network, ref))
        else:
            group(lease.container_id, lease.network, lease.ifname).resources.append(ref)
    for chain in snapshot.chains:
        if chain.container_id is None:
            continue
        ref = ResourceRef(
            "iptables",
            chain.chain,
            None,
            (("family", chain.family), ("table", chain.table), ("purpose", chain.purpose)),
        )
        partial.append((chain.container_id, chain.network, ref))
    for rule in snapshot.nft_rules:
        ref = ResourceRef("nft", f"{rule.family} {rule.table} {rule.chain} {rule.handle}", None)
        if rule.network is not None and rule.ifname is not None:
            group(rule.container_id, rule.network, rule.ifname).resources.append(ref)
        else:
            partial.append((rule.container_id, rule.network, ref))

    def primary(cid: str, net: str | None) -> _Builder:
        keys = [k for k in by_cid.get(cid, ()) if net is None or k.network == net]
        if keys:
            return groups[min(keys, key=_primary_order)]
        return group(cid, net, None)

    for cid, net, ref in partial:
        primary(cid, net).resources.append(ref)

    # Namespaces: a pin joins the container that a cache entry or a sandbox says it belongs to.
    ns_owner: dict[NsKey, str] = {}
    for entry in sorted(snapshot.cache_entries, key=lambda e: e.container_id):
        if entry.netns is not None:
            ns_owner.setdefault(entry.netns, entry.container_id)
    for sandbox in sorted(runtime.sandboxes, key=lambda s: s.id):
        if sandbox.netns is not None:
            ns_owner.setdefault(sandbox.netns, sandbox.id)

    pin_group: dict[NsKey, _Builder] = {}
    foreign: set[AttachmentKey] = set()
    for pin in sorted(snapshot.pins, key=lambda p: p.path):
        owner = ns_owner.get(pin.ns) if pin.is_namespace else None
        if owner is not None:
            b = primary(owner, None)
        else:
            b = group(None, None, None, pin.path)
            if not pin.runtime_named:
                foreign.add(b.key)
        b.resources.append(pin_ref(pin))
        if b.netns is None and pin.is_namespace:
            b.netns = pin.ns
        if pin.is_namespace:
            pin_group.setdefault(pin.ns, b)

    for veth in snapshot.veths:
        target: _Builder | None = None
        if veth.name in veth_owner:
            target = groups[veth_owner[veth.name]]
        elif veth.peer_netns is not None:
            target = pin_group.get(veth.peer_netns)
        if target is None:
            continue  # not a CNI resource: no cache entry names it, its peer is in no pinned netns
        details: list[tuple[str, str | int | float | bool | None]] = [("ifindex", veth.ifindex)]
        if veth.master:
            details.append(("master", veth.master))
        target.resources.append(ResourceRef("veth", veth.name, None, tuple(details)))

    return [
        ResourceGroup(b.key, tuple(b.resources), b.netns, b.key in foreign)
        for b in sorted(groups.values(), key=lambda b: _sort_key(b.key))
        if b.resources
    ]


def _sort_key(key: AttachmentKey) -> tuple[str, str, str, str]:
    return (key.container_id or "", key.network or "", key.ifname or "", key.pin or "")
