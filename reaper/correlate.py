"""Group the node's resources into attachments: (container ID, network, ifname). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from reaper.model import AttachmentKey, DetailValue, NetnsPin, NodeSnapshot, NsKey, ResourceRef, RuntimeView

# (container ID, network, ifname, pin path): tuples while grouping, AttachmentKey once done.
_Key = tuple[str | None, str | None, str | None, str | None]


@dataclass(frozen=True)
class ResourceGroup:
    """Resources that belong to one attachment, before any verdict."""

    key: AttachmentKey
    resources: tuple[ResourceRef, ...]
    netns: NsKey | None
    foreign: bool  # a pin nothing names, whose name no runtime makes
    uninspectable_netns: str | None = None  # a netns path it names that cannot be inspected


def _primary_order(key: _Key) -> tuple[bool, bool, str, str]:
    loopback = key[2] == "lo" or key[1] == "cni-loopback"
    return (loopback, key[1] is None, key[2] or "~", key[1] or "")


def pin_ref(pin: NetnsPin) -> ResourceRef:
    details: list[tuple[str, DetailValue]] = [("path", pin.path)]
    if not pin.is_namespace:
        details.append(("stale", True))
    if pin.holders:
        details.append(("pids", ",".join(str(h.pid) for h in pin.holders)))
    return ResourceRef("netns", pin.name, pin.mtime, tuple(details))


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
        keys = [k for k in self.by_cid.get(cid, ()) if net is None or k[1] == net]
        return min(keys, key=_primary_order) if keys else (cid, net, None, None)


def correlate(snapshot: NodeSnapshot, runtime: RuntimeView) -> list[ResourceGroup]:
    groups = _Groups()
    veth_owner: dict[str, _Key] = {}
    uninspectable: dict[_Key, str] = {}
    for entry in snapshot.cache_entries:
        key: _Key = (entry.container_id, entry.network, entry.ifname, None)
        cache_details: tuple[tuple[str, DetailValue], ...] = (("path", entry.path), ("legacy", entry.legacy))
        if entry.corrupt is not None:
            cache_details += (("corrupt", entry.corrupt),)
        groups.add(key, ResourceRef("cache", entry.name, entry.mtime, cache_details))
        if entry.netns is not None:
            groups.netns.setdefault(key, entry.netns)
        if entry.netns_uninspectable and entry.netns_path:
            uninspectable[key] = entry.netns_path
        for ifname in entry.host_ifnames:
            veth_owner.setdefault(ifname, key)

    partial: list[tuple[str, str | None, ResourceRef]] = []
    for lease in snapshot.leases:
        ref = ResourceRef("ipam", f"{lease.network}/{lease.ip}", lease.mtime, (("path", lease.path), ("ip", lease.ip)))
        if lease.ifname is None:
            partial.append((lease.container_id, lease.network, ref))
        else:
            groups.add((lease.container_id, lease.network, lease.ifname, None), ref)
    for chain in snapshot.chains:
        if chain.container_id is None:
            continue
        chain_details = (
            ("family", chain.family),
            ("table", chain.table),
            ("purpose", chain.purpose),
            ("backend", chain.backend),
        )
        partial.append((chain.container_id, chain.network, ResourceRef("iptables", chain.chain, None, chain_details)))
    for rule in snapshot.nft_rules:
        ref = ResourceRef("nft", f"{rule.family} {rule.table} {rule.chain} {rule.handle}", None)
        if rule.network is not None and rule.ifname is not None:
            groups.add((rule.container_id, rule.network, rule.ifname, None), ref)
        else:
            partial.append((rule.container_id, rule.network, ref))
    for cid, net, ref in partial:
        groups.add(groups.primary(cid, net), ref)

    # Namespaces: a pin joins the container that a cache entry or a sandbox says it belongs to.
    ns_owner: dict[NsKey, str] = {}
    for entry in sorted(snapshot.cache_entries, key=lambda e: e.container_id):
        if entry.netns is not None:
            ns_owner.setdefault(entry.netns, entry.container_id)
    for sandbox in sorted(runtime.sandboxes, key=lambda s: s.id):
        if sandbox.netns is not None:
            ns_owner.setdefault(sandbox.netns, sandbox.id)

    pin_group: dict[NsKey, _Key] = {}
    foreign: set[_Key] = set()
    for pin in sorted(snapshot.pins, key=lambda p: p.path):
        owner = ns_owner.get(pin.ns) if pin.is_namespace else None
        key = groups.primary(owner, None) if owner is not None else (None, None, None, pin.path)
        if owner is None and not pin.runtime_named:
            foreign.add(key)
        groups.add(key, pin_ref(pin))
        if pin.is_namespace:
            groups.netns.setdefault(key, pin.ns)
            pin_group.setdefault(pin.ns, key)

    for veth in snapshot.veths:
        target = veth_owner.get(veth.name)
        if target is None and veth.peer_netns is not None:
            target = pin_group.get(veth.peer_netns)
        if target is None:
            continue  # not a CNI resource: no cache entry names it, its peer is in no pinned netns
        veth_details: tuple[tuple[str, DetailValue], ...] = (
            ("ifindex", veth.ifindex),
            ("peer_ifindex", veth.peer_ifindex),
            ("peer_netnsid", veth.peer_netnsid),
        )
        if veth.master:
            veth_details += (("master", veth.master),)
        groups.add(target, ResourceRef("veth", veth.name, None, veth_details))

    return [
        ResourceGroup(AttachmentKey(*key), tuple(refs), groups.netns.get(key), key in foreign, uninspectable.get(key))
        for key, refs in sorted(groups.resources.items(), key=lambda item: _sort_key(item[0]))
    ]


def _sort_key(key: _Key) -> tuple[str, str, str, str]:
    return (key[0] or "", key[1] or "", key[2] or "", key[3] or "")
