"""Whether an orphan's addresses are configured in some other network namespace right now.

A writer of /var/lib/cni can split a running container's files from its namespace; where an
address is configured in the kernel cannot be forged. So right before acting, each selected
orphan that holds addresses (leases, firewall rules, masquerade jumps; never cached results) is
compared with every other namespace on the node, and left when its address is there or that
cannot be told (fail closed). Namespaces are weighed by who made them (reaper.host.userns).
Why each rule holds: docs/design.md, "The address check"; SECURITY.md, "Who can hold a pod's
address".
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from msgspec import Struct
from msgspec.structs import replace

from reaper.host.netns_addrs import Handle, NamespaceAddresses, NamespaceToRead, read_addresses, this_threads_netns
from reaper.host.nsmounts import NsMount, held_mounts
from reaper.host.procs import netns_members, unseen_processes
from reaper.host.userns import mount_namespace_owners
from reaper.kinds.netns import collect_pins
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import Attachment, AttachmentKey, Identity, NsKey

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEADLINE = 10.0  # seconds for reading every namespace's addresses, all together
HANDLES = 4  # ways to reach one namespace kept (its pins, then the lowest pids in it)
W = TypeVar("W")  # what one new walk gives (_read_again)
UNREACHABLE = "/proc/0/ns/net"  # a handle that opens nothing: there is no process 0


class HeldAddresses(Struct, frozen=True):
    """The addresses an attachment would free, and the namespaces that are its own."""

    addresses: tuple[IPAddress, ...]  # by meaning (see address_key)
    own: frozenset[NsKey]


def address_key(text: str) -> IPAddress | None:
    """An address by meaning (prefix and zone dropped, IPv4-mapped IPv6 as IPv4); None when it is
    no address, or one every namespace has (loopback, link-local, unspecified, multicast)."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        address = ipaddress.ip_address(text.split("/", 1)[0].split("%", 1)[0].strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast:
        return None
    return address


def packed_forms(addresses: Sequence[IPAddress]) -> frozenset[bytes]:
    """The bytes the kernel may hold each address as: an IPv4 address also as IPv4-mapped IPv6."""
    mapped = (b"\0" * 10 + b"\xff\xff" + a.packed for a in addresses if isinstance(a, ipaddress.IPv4Address))
    return frozenset([*(a.packed for a in addresses), *mapped])


def mounting_user(mount: NsMount) -> int | None:
    """The uid of the user without root whose mount namespace holds `mount`; None when root's,
    or when it cannot be told (a holder gone)."""
    if mount.made_by_user is not None:
        return mount.made_by_user  # a mount namespace no process is in: the walk asked its pin
    owners = mount_namespace_owners(mount.pid, mount.mount_ns)
    return None if owners is None else owners.user


def addresses_held(
    attachment: Attachment, records: Mapping[Identity, Any], registry: Registry = REGISTRY
) -> HeldAddresses:
    """What `attachment` would free that is an address, and the namespaces its own pins hold."""
    texts: list[str] = []
    own: set[NsKey] = {attachment.netns} if attachment.netns is not None else set()
    for ref in attachment.resources:
        record, kind = records.get(ref.identity), registry.by_name.get(ref.kind)
        if record is None or kind is None:
            continue
        if kind.frees is not None:
            texts.extend(kind.frees(record))
        if (pin := registry.pin_of(ref, records)) is not None:
            own.add(pin.ns)
    keyed = (address_key(text) for text in texts)
    return HeldAddresses(tuple(dict.fromkeys(k for k in keyed if k is not None)), frozenset(own))


def leave_for_addresses(
    held: Mapping[AttachmentKey, HeldAddresses],
    seen: Sequence[NamespaceAddresses],
    unseen: str | None,
    dead: frozenset[NsKey] = frozenset(),
) -> dict[AttachmentKey, str]:
    """Pure: why each attachment must be left, by what `seen` (each namespace read, or why not)
    holds: any namespace but its own, and its own unless in `dead` (an orphan's pin this pass
    frees, no process inside). `unseen`: why not every namespace could be listed (leaves all)."""
    counted = [ns for ns in seen if ns.ns not in dead and ns.made_by_user is None]
    configured: dict[IPAddress, list[NamespaceAddresses]] = {}
    for ns in counted:
        for text in ns.addresses:
            address = address_key(text)
            if address is not None:
                configured.setdefault(address, []).append(ns)
    failed = [ns for ns in counted if ns.error is not None]
    # Unread and found only through users' mounts: each may be the namespace of one attachment.
    users_unread = {ns.ns: ns for ns in failed if ns.mounted_by_user is not None}
    failed = [ns for ns in failed if ns.mounted_by_user is None]

    def why_left(holds: HeldAddresses) -> str | None:
        first = holds.addresses[0]
        untold = f"whether a live pod holds its address {first} cannot be told"
        if unseen is not None:
            return f"not every network namespace on the node can be seen ({unseen}): {untold}"
        where = [(address, ns) for address in holds.addresses for ns in configured.get(address, ())]
        elsewhere = next(((address, ns) for address, ns in where if ns.ns not in holds.own), None)
        if elsewhere is not None:
            address, ns = elsewhere
            return f"its address {address} is configured in {ns.where}, not its own: a live pod holds it"
        # Its own namespace, if this pass does not free it (`configured` holds none in `dead`), keeps
        # the address configured: freed, the lease would hand it to a new pod while it is there.
        if where:
            address, ns = where[0]
            return (
                f"its address {address} is still configured in its own namespace, {ns.where}, which this pass does"
                " not free"
            )
        own_unread = next((users_unread[ns] for ns in sorted(holds.own) if ns in users_unread), None)
        if own_unread is not None:
            return (
                f"its own namespace, {own_unread.where} (a mount of uid {own_unread.mounted_by_user}'s), could not be"
                f" read ({own_unread.error}): whether it still holds its address {first} cannot be told"
            )
        unread = next((ns for ns in failed if ns.ns not in holds.own), None)
        if unread is not None:
            return f"the addresses configured in {unread.where} could not be read ({unread.error}): {untold}"
        return None

    return {key: why for key, holds in held.items() if holds.addresses and (why := why_left(holds)) is not None}


def node_namespaces(
    netns_dirs: tuple[str, ...],
    members: Mapping[NsKey, set[int]],
    skip: frozenset[NsKey],
    mounted: Mapping[NsKey, tuple[NsMount, ...]] | None = None,
    mounting: Callable[[NsMount], int | None] = mounting_user,
) -> list[NamespaceToRead]:
    """Every network namespace on the node but those in `skip`: this thread's, each pinned in the
    netns dirs, each a process is in (`members`), each a mount holds elsewhere (`mounted`). One
    found only through mounts `mounting` names a user without root for is marked with that user."""
    mounted = mounted or {}
    pins, _ = collect_pins(netns_dirs, ())
    here = this_threads_netns()
    handles: dict[NsKey, list[Handle]] = {}
    pinned_at: dict[NsKey, str] = {}
    for pin in pins:
        if pin.is_namespace:
            handles.setdefault(pin.ns, []).append(Handle(pin.path, pinned=True))
            pinned_at.setdefault(pin.ns, pin.path)
    for ns, inside in members.items():
        ways = [Handle(f"/proc/{pid}/ns/net", pinned=False) for pid in sorted(inside)[:HANDLES]]
        handles.setdefault(ns, []).extend(ways)
    for ns, mounts in mounted.items():
        # The mount point beneath its holder's root, no symlink followed, local filesystems only;
        # with no such way, one that opens nothing makes it unread, never this thread's netns.
        ways = [Handle(m.mount_point, pinned=True, beneath=f"/proc/{m.pid}/root") for m in mounts if m.reachable]
        handles.setdefault(ns, []).extend(ways or [Handle(UNREACHABLE, pinned=False)])
    asked: dict[tuple[int, int], int | None] = {}  # who made each holder's mount namespace, asked once
    targets = [] if here in skip else [NamespaceToRead(here, "the netns the reaper runs in", ())]
    for ns, ways in sorted(handles.items()):
        if ns == here or ns in skip:
            continue
        pids = sorted(members.get(ns, ()))
        user: int | None = None
        if ns in pinned_at:
            where = f"the netns pinned at {pinned_at[ns]}" + (f" (pid {pids[0]} inside)" if pids else "")
        elif pids:
            where = f"the netns of pid {pids[0]}"
        else:
            where = f"the netns held by {mounted[ns][0].describe()}"
            for m in mounted[ns]:
                if (m.pid, m.mount_ns) not in asked:
                    asked[m.pid, m.mount_ns] = mounting(m)
            users = [asked[m.pid, m.mount_ns] for m in mounted[ns]]
            user = users[0] if None not in users else None
        alone = ns not in pinned_at and ns not in mounted and 0 < len(pids) <= HANDLES
        targets.append(NamespaceToRead(ns, where, tuple(ways[:HANDLES]), user, only_processes=alone))
    return targets


def addresses_in_use(
    attachments: Sequence[Attachment],
    records: Mapping[Identity, Any],
    netns_dirs: tuple[str, ...],
    *,
    deadline: float = DEADLINE,
    clock: Callable[[], float] = time.monotonic,
    registry: Registry = REGISTRY,
) -> dict[AttachmentKey, str]:
    """Why each orphan about to be reclaimed must be left: an address it holds is configured in
    another namespace now, or that cannot be told. Reads nothing when none holds an address."""
    held = {a.key: holds for a in attachments if (holds := addresses_held(a, records, registry)).addresses}
    if not held:
        return {}
    unseen = unseen_processes()
    if unseen is not None:
        return leave_for_addresses(held, [], unseen)
    try:
        members = netns_members()
    except OSError as err:
        return leave_for_addresses(held, [], f"the walk of /proc failed: {err}")
    try:
        # A namespace a mount holds elsewhere, its pin gone, keeps its pod's addresses.
        mounted = held_mounts(netns_dirs).held
    except OSError as err:
        return leave_for_addresses(held, [], f"the mounts of every mount namespace cannot be read: {err}")
    # The pins of the orphans this pass reclaims, nothing inside: an address configured there is
    # that dead pod's (a runtime that forgot a sandbox leaves its pin and files as two attachments).
    pins = (registry.pin_of(ref, records) for a in attachments for ref in a.resources)
    dead = frozenset(p.ns for p in pins if p is not None and p.ns not in members and p.ns not in mounted)
    # A namespace that is every such attachment's own, or dead, is not read: it proves none live.
    # One a process is in or a mount holds elsewhere outlives the pass, its addresses with it.
    own_everywhere = frozenset.intersection(*(h.own for h in held.values()))
    skip = dead | frozenset(ns for ns in own_everywhere if ns not in members and ns not in mounted)
    targets = node_namespaces(netns_dirs, members, skip, mounted)
    wanted = packed_forms([address for h in held.values() for address in h.addresses])
    read = partial(read_addresses, deadline=clock() + deadline, clock=clock, wanted=wanted)
    seen = reread_churned(targets, read(targets), netns_members, read)

    def look_again() -> list[NamespaceToRead]:
        now = held_mounts(netns_dirs).held
        return node_namespaces(netns_dirs, netns_members(), skip, now)

    seen = reread_unmounted(targets, seen, look_again, read)
    return leave_for_addresses(held, seen, None, dead)


def _pinned_or_mounted(target: NamespaceToRead) -> bool:
    """Whether `target` was found through a pin or a mount elsewhere, not through processes alone."""
    return bool(target.handles) and not _only_processes(target)


def _only_processes(target: NamespaceToRead) -> bool:
    """Whether `target` was found only through processes in it (no pin, no mount). UNREACHABLE
    is a mount's (one below a filesystem not walked), though it looks like a process's path."""
    return bool(target.handles) and all(
        not h.pinned and h.path.startswith("/proc/") and h.path != UNREACHABLE for h in target.handles
    )


def _read_again(
    targets: Sequence[NamespaceToRead],
    seen: list[NamespaceAddresses],
    which: Callable[[NamespaceToRead], bool],
    walk: Callable[[], W],
    again_as: Callable[[NamespaceToRead, W], NamespaceToRead | None],
    read: Callable[[Sequence[NamespaceToRead]], list[NamespaceAddresses]],
) -> list[NamespaceAddresses]:
    """`seen` with each unread target `which` picks looked up in one new `walk`: read again as
    `again_as` finds it there, or read as empty when nothing holds it now, as a pass started now
    would not see it at all. A walk that fails, or a read that fails again, keeps the error."""
    picked = [i for i, (t, found) in enumerate(zip(targets, seen, strict=True)) if found.error is not None and which(t)]
    if not picked:
        return seen
    try:
        walked = walk()
    except OSError:
        return seen  # the first errors stand
    out = list(seen)
    again: list[tuple[int, NamespaceToRead]] = []
    for i in picked:
        target = targets[i]
        found = again_as(target, walked)
        if found is None:
            out[i] = NamespaceAddresses(target.ns, target.where, (), None, None, target.mounted_by_user)
        else:
            again.append((i, found))
    if again:
        for (i, _), result in zip(again, read([t for _, t in again]), strict=True):
            out[i] = result
    return out


def reread_unmounted(
    targets: Sequence[NamespaceToRead],
    seen: list[NamespaceAddresses],
    look_again: Callable[[], Sequence[NamespaceToRead]],
    read: Callable[[Sequence[NamespaceToRead]], list[NamespaceAddresses]],
) -> list[NamespaceAddresses]:
    """`seen` with each unread namespace found through a pin or a mount elsewhere looked up in a
    new walk of the netns dirs, /proc and the mounts (its runtime may have removed its pin, its
    holder exited or unmounted it, while the pass read) and read through whatever pin, process or
    mount holds it now. Under churn a pod's pin and its last process go between the walk and the
    read; its handles then all fail, the last one's error shown: a process's or a mount's whose
    holder cannot be looked at (a protected init's root: Permission denied), not the pin's."""
    return _read_again(
        targets, seen, _pinned_or_mounted, lambda: {t.ns: t for t in look_again()}, lambda t, now: now.get(t.ns), read
    )


def reread_churned(
    targets: Sequence[NamespaceToRead],
    seen: list[NamespaceAddresses],
    members: Callable[[], Mapping[NsKey, set[int]]],
    read: Callable[[Sequence[NamespaceToRead]], list[NamespaceAddresses]],
) -> list[NamespaceAddresses]:
    """`seen` with each unread namespace found only through processes tried once more through
    those a new walk of /proc finds in it (its first ones may have exited); one with none left
    reads as empty (netns_addrs.EveryProcessLeft)."""

    def through(target: NamespaceToRead, now: Mapping[NsKey, set[int]]) -> NamespaceToRead | None:
        pids = sorted(now.get(target.ns, ()))
        if not pids:
            return None
        ways = tuple(Handle(f"/proc/{pid}/ns/net", pinned=False) for pid in pids[:HANDLES])
        return replace(target, handles=ways, only_processes=len(pids) <= HANDLES)

    return _read_again(targets, seen, _only_processes, members, through, read)
