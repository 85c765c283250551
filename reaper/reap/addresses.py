"""Whether an orphan's addresses are configured in some other network namespace right now.

Files under /var/lib/cni tie an attachment together, and a writer of those files can take a
running container's cache entry apart from its namespace (no `netns`, no interface
`sandbox`): its cache entry, lease, masquerade chain and firewall rules then make an
attachment of no namespace, apart from the pin, veth and process that show it alive, or one
joined to some other, dead pin. What the writer cannot forge is where an address is configured
in the kernel. So, right before acting, every selected orphan that holds addresses is compared
with the addresses configured in every namespace on the node but its own pinned one(s): the
netns the reaper runs in, every pinned namespace, every namespace a process is in, every
namespace a mount holds in any mount namespace (reaper.host.nsmounts). One whose address is
configured elsewhere is left this pass, with where; so is every such orphan when some namespace
could not be read, or not every process or mount could be seen (fail closed). The pins of the
orphans the pass reclaims, with no process inside, prove nothing live: a runtime that forgot a
sandbox leaves its pin and its files as two attachments, the address of one in the other.

Each namespace is weighed by what it could really hold (reaper.host.userns tells who made it):
- One a user without root made (its owning user namespace, or one above it below the reaper's,
  owned by a uid other than 0) holds no pod's address: a pod's interface reaches it only
  through a link made in, or moved from, a namespace of the node's or a pod's, which takes
  CAP_NET_ADMIN over that namespace's owning user namespace (the kernel's rtnetlink checks it
  of the link's source and target namespaces), and such a user has it over its own only. The
  runtimes make pods' namespaces as root, in the host's user namespace or in one they make for
  the pod (containerd pkg/netns/netns_linux.go: a new netns, or that of the sandbox's first
  process, bind-mounted on a file it creates; CRI-O pinns/src/pinns.c: unshare as root, the
  user namespace first when the pod has one, then the pin). So such a namespace is neither
  read (it costs nothing, however much it holds) nor keeps anything: the addresses its owner
  configured there, or that an unprivileged user would hide there, are its owner's own.
- One found only through mounts in mount namespaces such users made may still be a pod's: a
  pin is an nsfs file of mode 0444 (fs/nsfs.c), which anyone who can reach it may open and
  bind-mount in a mount namespace of their own. Read through that mount, it counts as any
  other. When it cannot be read (its mount below a filesystem that is never walked, hidden
  under another mount), it keeps only the attachment it is the namespace of (by its key:
  nsfs' device and the inode of `net:[INODE]` in the mountinfo), not every orphan on the node.
- Any other namespace that cannot be read (made by root, or by no one the reaper can name)
  leaves every orphan holding an address, as before: only root could have made it so.

The addresses an orphan holds are those the reaper would free: its leases' and those the kernel
holds for it, its firewall rules' and the jumps to its masquerade chain (written by the plugins,
beyond a file writer's reach). Not its cache entries' results: that writer can put any address
there, and one live address written into a real leak's entry would keep the leak (pin, veth,
chains) for good. What a cached prevResult would make a plugin do is reaper.reap.trust's to
check.

Addresses are compared by meaning (ipaddress; an IPv4-mapped IPv6 address is its IPv4
address). Loopback, link-local, unspecified and multicast addresses are no pod's own: every
namespace has some, so they are left out on both sides.

The cost is paid only when some selected orphan holds an address: one /proc walk, one read of
every mount namespace's mounts, one listing of the netns dirs, and one address dump per
namespace (reaper.host.netns_addrs), all within one deadline, each dump bounded, and of what a
namespace holds only the addresses the orphans hold kept.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msgspec import Struct
from msgspec.structs import replace

from reaper.host.netns_addrs import Handle, NamespaceAddresses, NamespaceToRead, read_addresses, this_threads_netns
from reaper.host.nsmounts import NsMount, held_elsewhere, netns_mounts, own_mount_namespace
from reaper.host.procs import netns_members, unseen_processes
from reaper.host.userns import mount_namespace_owners
from reaper.kinds.netns import collect_pins
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import Attachment, AttachmentKey, Identity, NsKey

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEADLINE = 10.0  # seconds for reading every namespace's addresses, all together
HANDLES = 4  # ways to reach one namespace kept (its pins, then the lowest pids in it)
UNREACHABLE = "/proc/0/ns/net"  # a handle that opens nothing: there is no process 0


class HeldAddresses(Struct, frozen=True):
    """The addresses an attachment would free, and the namespaces that are its own."""

    addresses: tuple[IPAddress, ...]  # by meaning (see address_key)
    own: frozenset[NsKey]


def address_key(text: str) -> IPAddress | None:
    """An address by meaning: prefix length and zone dropped, IPv4-mapped IPv6 folded to IPv4.
    None when it is no address, or one no pod holds as its own (loopback, link-local,
    unspecified, multicast)."""
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
    forms: set[bytes] = set()
    for address in addresses:
        forms.add(address.packed)
        if isinstance(address, ipaddress.IPv4Address):
            forms.add(ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed).packed)
    return frozenset(forms)


def mounting_user(mount: NsMount) -> int | None:
    """The uid of the user without root whose mount namespace holds `mount`; None when root's,
    or when it cannot be told (a holder gone). A mount namespace no process is in is told by
    the walk, through the file it is pinned on."""
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
    """Pure: why each attachment must be left, by what the namespaces hold: any other than its
    own, and its own unless this pass frees it (in `dead`).
    `seen`: each namespace read (or why it could not be); `unseen`: why not every namespace on
    the node could even be listed, which leaves every attachment holding an address; `dead`:
    namespaces no attachment's address proves live in (pinned by an orphan this pass reclaims,
    with no process inside), whose addresses are the leftovers of a pod that is gone."""
    configured: dict[IPAddress, list[NamespaceAddresses]] = {}
    for ns in seen:
        if ns.ns in dead or ns.made_by_user is not None:
            continue
        for text in ns.addresses:
            address = address_key(text)
            if address is not None:
                configured.setdefault(address, []).append(ns)
    failed = [ns for ns in seen if ns.error is not None and ns.ns not in dead and ns.made_by_user is None]
    # Unread and found only through users' mounts: each may be the namespace of one attachment.
    users_unread = {ns.ns: ns for ns in failed if ns.mounted_by_user is not None}
    failed = [ns for ns in failed if ns.mounted_by_user is None]
    reasons: dict[AttachmentKey, str] = {}
    for key, holds in held.items():
        if not holds.addresses:
            continue
        first = holds.addresses[0]
        if unseen is not None:
            reasons[key] = (
                f"not every network namespace on the node can be seen ({unseen}): whether a live pod holds its"
                f" address {first} cannot be told"
            )
            continue
        where = [(address, ns) for address in holds.addresses for ns in configured.get(address, ())]
        elsewhere = next(((address, ns) for address, ns in where if ns.ns not in holds.own), None)
        if elsewhere is not None:
            address, ns = elsewhere
            reasons[key] = f"its address {address} is configured in {ns.where}, not its own: a live pod holds it"
            continue
        # Its own namespace, if this pass does not free it (a mount elsewhere holds it, its pin
        # already gone, or a process is inside), keeps the address configured: freed, the lease
        # would hand it to a new pod while it is there.
        own_kept = next(((address, ns) for address, ns in where if ns.ns not in dead), None)
        if own_kept is not None:
            address, ns = own_kept
            reasons[key] = (
                f"its address {address} is still configured in its own namespace, {ns.where}, which this pass does"
                " not free"
            )
            continue
        own_unread = next((users_unread[ns] for ns in sorted(holds.own) if ns in users_unread), None)
        if own_unread is not None:
            reasons[key] = (
                f"its own namespace, {own_unread.where} (a mount of uid {own_unread.mounted_by_user}'s), could not be"
                f" read ({own_unread.error}): whether it still holds its address {first} cannot be told"
            )
            continue
        unread = next((ns for ns in failed if ns.ns not in holds.own), None)
        if unread is not None:
            reasons[key] = (
                f"the addresses configured in {unread.where} could not be read ({unread.error}): whether a live"
                f" pod holds its address {first} cannot be told"
            )
    return reasons


def node_namespaces(
    netns_dirs: tuple[str, ...],
    members: Mapping[NsKey, set[int]],
    skip: frozenset[NsKey],
    mounted: Mapping[NsKey, tuple[NsMount, ...]] | None = None,
    mounting: Callable[[NsMount], int | None] = mounting_user,
) -> list[NamespaceToRead]:
    """Every network namespace on the node but those in `skip`: the one this thread is in, each
    pinned under the netns dirs, each some process is in (`members`, from a walk of /proc),
    each a mount holds elsewhere (`mounted`, reached through its holder's root). One found
    only through mounts every one of which `mounting` names a user without root for is marked
    with that user (the first such mount's)."""
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
        # The mount point as its holder sees it, beneath its root with no symlink followed, and
        # only through local filesystems; with no such way, one that opens nothing (/proc/0 is
        # no process) makes the namespace unread, never the one this thread is in.
        ways = [Handle(m.mount_point, pinned=True, beneath=f"/proc/{m.pid}/root") for m in mounts if m.reachable][
            :HANDLES
        ]
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
    """Why each of `attachments` (the orphans a pass is about to reclaim) must be left because
    an address it holds is configured in another namespace now, or that cannot be told (see
    leave_for_addresses). Reads nothing when none of them holds an address."""
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
        mounted = held_elsewhere(netns_mounts(), netns_dirs, own_mount_namespace())
    except OSError as err:
        return leave_for_addresses(held, [], f"the mounts of every mount namespace cannot be read: {err}")
    # The pins of the orphans this pass reclaims, nothing inside: a split-off lease's address
    # configured there is that dead pod's (a runtime that forgot a sandbox leaves its pin and
    # its files as two attachments).
    pins = (registry.pin_of(ref, records) for a in attachments for ref in a.resources)
    dead = frozenset(p.ns for p in pins if p is not None and p.ns not in members and p.ns not in mounted)
    # A namespace that is every such attachment's own, or dead, is not read: it proves none live.
    # One a process is in or a mount holds elsewhere outlives the pass, its addresses with it.
    own_everywhere = frozenset.intersection(*(h.own for h in held.values()))
    skip = dead | frozenset(ns for ns in own_everywhere if ns not in members and ns not in mounted)
    targets = node_namespaces(netns_dirs, members, skip, mounted)
    wanted = packed_forms([address for h in held.values() for address in h.addresses])
    until = clock() + deadline
    seen = read_addresses(targets, deadline=until, clock=clock, wanted=wanted)
    seen = reread_churned(targets, seen, netns_members, lambda again: read_addresses(
        again, deadline=until, clock=clock, wanted=wanted))  # fmt: skip
    return leave_for_addresses(held, seen, None, dead)


def reread_churned(
    targets: Sequence[NamespaceToRead],
    seen: list[NamespaceAddresses],
    members: Callable[[], Mapping[NsKey, set[int]]],
    read: Callable[[Sequence[NamespaceToRead]], list[NamespaceAddresses]],
) -> list[NamespaceAddresses]:
    """`seen` with each namespace found only through processes (no pin, no mount) and not read
    tried once more through the processes one more walk of /proc finds in it: its first ones
    may have exited while it was read (a namespace with more processes than HANDLES, whose
    lowest pids come and go). One that no process is in at that walk is read as empty, as one
    whose every process left is (reaper.host.netns_addrs.EveryProcessLeft). What fails again
    keeps its error: the pass leaves what that namespace might hold."""
    churned = [
        i
        for i, (target, found) in enumerate(zip(targets, seen, strict=True))
        if found.error is not None
        and target.handles
        and all(not h.pinned and h.path.startswith("/proc/") for h in target.handles)
    ]
    if not churned:
        return seen
    try:
        now = members()
    except OSError:
        return seen  # the first errors stand
    out = list(seen)
    again: list[tuple[int, NamespaceToRead]] = []
    for i in churned:
        target = targets[i]
        pids = sorted(now.get(target.ns, ()))
        if not pids:
            out[i] = NamespaceAddresses(target.ns, target.where, (), None, None, target.mounted_by_user)
            continue
        ways = tuple(Handle(f"/proc/{pid}/ns/net", pinned=False) for pid in pids[:HANDLES])
        again.append((i, replace(target, handles=ways, only_processes=len(pids) <= HANDLES)))
    if again:
        for (i, _), found in zip(again, read([t for _, t in again]), strict=True):
            out[i] = found
    return out
