"""What stays with a network namespace that stays: its attachments' leases and the rules naming
their addresses.

The kernel step frees an attachment's kinds in the registry's order, and it may keep a pin or
a veth on purpose: a chain with a plugin that keeps state elsewhere still needs its DEL
(reaper.reap.requests.kept_state), the pin is busy, its unmount or unlink failed, a veth's peer is
in use, or the attachment's pin is another attachment's that this pass does not reclaim. Then
the namespace lives on, and so does every address configured in it. A lease freed then is an
address host-local hands to the next pod while the old namespace still has it on `eth0`:
antrea#8239's duplicate pod IPs, reached another way. So an attachment's records that hand out
or route its addresses (`Kind.with_addresses`: leases, firewall and masquerade rules, AWS ip
rules) go only once no namespace it lives in stays, and are reported kept, with the record
that keeps the namespace and why.

An address can also sit in another orphan's namespace: a runtime that forgot a sandbox leaves
its pin and its files as two attachments, the lease of one configured in the other's pin. The
address check before acting (reaper.reap.addresses) does not read the pins of the orphans the
pass reclaims, since they go with it; so the kernel step reads those of them that stay, and a
record that frees an address configured in one of them (or in one that cannot be read) stays.

The rule reads the kinds' hooks only (`keeps_netns`, `with_addresses`); which records keep a
namespace, and which serve an address, is each kind's own knowledge. `reclaim_order` puts every
kind that keeps a namespace before every kind with addresses, so the answer is known in time.
Pure: no I/O (the caller reads the namespaces).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any

from reaper.kinds import Kind
from reaper.model import Attachment, Done, Identity, NsKey
from reaper.reap.addresses import address_key

if TYPE_CHECKING:  # the record the caller's read makes; this module reads no namespace
    from reaper.host.netns_addrs import NamespaceAddresses

Records = Mapping[Identity, Any]
UNTOUCHED = "not reclaimed this pass"
_WHY_CHARS = 160


def _keeper(kinds: Sequence[Kind[Any]], identity: Identity, record: Any) -> tuple[Kind[Any], NsKey] | None:
    """The record's kind and the namespace it keeps, when it is a record that keeps one."""
    for kind in kinds:
        if kind.keeps_netns is None or identity[:1] != (kind.name,) or kind.identity(record) != identity:
            continue
        ns = kind.keeps_netns(record)
        return (kind, ns) if ns is not None else None
    return None


def staying_namespaces(
    kinds: Sequence[Kind[Any]], present: Records, done: Mapping[Identity, Done], unread: Set[str] = frozenset()
) -> dict[NsKey, str] | str:
    """Each namespace some record on the node still keeps after the kinds that keep namespaces
    ran (`done`: what they did this step), and in words which record and why it stays. A
    string instead when that cannot be told: `unread` (the kinds the look could not read
    whole) holds a kind that keeps namespaces."""
    partly = sorted(k.name for k in kinds if k.keeps_netns is not None and k.name in unread)
    if partly:
        return f"the look could not read every {', '.join(partly)}: whether a namespace still holds it cannot be told"
    staying: dict[NsKey, str] = {}
    for identity, record in present.items():
        found = _keeper(kinds, identity, record)
        if found is None:
            continue
        result = done.get(identity)
        if result is not None and result.ok:
            continue
        kind, ns = found
        why = result.error if result is not None and result.error else UNTOUCHED
        if len(why) > _WHY_CHARS:
            why = why[: _WHY_CHARS - 3] + "..."
        staying.setdefault(ns, f"{kind.name} {kind.ref(record).name} stays ({why})")
    return staying


def lives_in(kinds: Sequence[Kind[Any]], attachment: Attachment, present: Records) -> set[NsKey]:
    """The namespaces an attachment's addresses are configured in: its own, and each one its
    records keep (its pin's, its veths' peers')."""
    found = {attachment.netns} if attachment.netns is not None else set()
    for ref in attachment.resources:
        record = present.get(ref.identity)
        keeper = _keeper(kinds, ref.identity, record) if record is not None else None
        if keeper is not None:
            found.add(keeper[1])
    return found


def kept_with_namespace(
    kinds: Sequence[Kind[Any]], attachment: Attachment, present: Records, staying: Mapping[NsKey, str] | str
) -> str | None:
    """Why the attachment's records `with_addresses` stay this pass: a namespace it lives in
    stays (or whether one does cannot be told); None when they may go."""
    if isinstance(staying, str):
        return f"kept with its addresses: {staying}"
    for ns in sorted(lives_in(kinds, attachment, present)):
        if ns in staying:
            return (
                f"kept: its address stays configured in the netns that {staying[ns]}; freed with that netns, "
                "never before"
            )
    return None


def held_in_staying(addresses: Iterable[str], own: Set[NsKey], seen: Sequence[NamespaceAddresses]) -> str | None:
    """Why a record that frees `addresses` (as written) stays: one of them is configured in a
    namespace of `seen` (the pins of this pass's orphans that stay, as read) that is not one of
    its attachment's own (`own`: those keep it anyway), or such a namespace could not be read.
    Addresses compare by meaning (reaper.reap.addresses.address_key)."""
    keys = [key for key in map(address_key, addresses) if key is not None]
    if not keys:
        return None
    for ns in seen:
        if ns.ns in own:
            continue
        if ns.error is not None:
            return f"kept: whether {ns.where} holds its address {keys[0]} cannot be told ({ns.error[:_WHY_CHARS]})"
        configured = {address_key(text) for text in ns.addresses}
        found = next((key for key in keys if key in configured), None)
        if found is not None:
            return f"kept: its address {found} is configured in {ns.where}; freed with that netns, never before"
    return None
