"""What stays with a network namespace that stays: its attachments' leases and the rules naming
their addresses (the kinds' `with_addresses` records), kept while a namespace they live in, or
an address they free, stays. Pure: no I/O (the caller reads the namespaces). Why (antrea#8239's
duplicate IPs): docs/design.md, "What stays with a namespace that stays".
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
    """Each namespace a record still keeps once the kinds that keep namespaces ran (`done`), with
    which record and why; a string when that cannot be told (`unread` holds such a kind)."""
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
    refs = (ref for ref in attachment.resources if ref.identity in present)
    keepers = (_keeper(kinds, ref.identity, present[ref.identity]) for ref in refs)
    own = {attachment.netns} if attachment.netns is not None else set()
    return own | {keeper[1] for keeper in keepers if keeper is not None}


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
    """Why a record that frees `addresses` stays: one is configured in a namespace of `seen` (this
    pass's orphans' pins that stay, as read) other than its own (`own`), or one could not be read."""
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
