"""Resource kinds: the contract each one meets, and the order they are found and reclaimed in.

A kind's module owns everything known about it: how it is found, its identity on the node,
the producer's key that ties it to an attachment, and how it is reclaimed with a compare
before every delete. Finding and re-checking use the same reader, so the two can never
disagree about what a resource is. `reaper.kinds.registry` lists the kinds.

`Kind` is the core every kind fills (name, find, identity, ref, tie, reclaim) and the roles
several kinds share; what one kind alone knows stays a function of its module, which its one
caller calls directly. A kind reads the records of one found before it with
`look.found(other.KIND)`, typed by that kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from msgspec import Struct

from reaper.host.memo import InventoryMemo
from reaper.host.nsmounts import in_use
from reaper.host.quarantine import Quarantine
from reaper.model import (
    Claim,
    CorruptFile,
    DetailValue,
    Done,
    Identity,
    NetworkConfig,
    NodeSnapshot,
    NsKey,
    ResourceRef,
    SourceError,
    Tie,
)
from reaper.options import FindOptions

R = TypeVar("R")
T = TypeVar("T")


class Look(Struct, frozen=True):
    """What a kind's find is given: the options, the memo, and what was found before it."""

    options: FindOptions
    memo: InventoryMemo
    configs: tuple[NetworkConfig, ...]  # the node's own: the conf dir's, never a cached one
    earlier: Mapping[str, tuple[Any, ...]]  # records of the kinds found before this one, by name

    def found(self, kind: Kind[R]) -> tuple[R, ...]:
        """The records of `kind` found before this one; empty when it was not (yet) found."""
        return cast("tuple[R, ...]", self.earlier.get(kind.name, ()))


class Found(Struct, Generic[R], frozen=True):
    records: tuple[R, ...]
    corrupt: tuple[CorruptFile, ...] = ()
    errors: tuple[SourceError, ...] = ()
    configs: tuple[NetworkConfig, ...] = ()  # network configs the records carry (cache entries do)


class ReclaimContext(Struct, frozen=True, kw_only=True):
    netns_dirs: tuple[str, ...]
    bin_dirs: tuple[str, ...]
    live_netns: frozenset[NsKey]  # namespaces the runtime named at the re-check
    quarantine: Quarantine | None
    command_timeout: float
    done: Mapping[Identity, Done]  # what the kinds reclaimed before this one did, this pass
    # Who is in which namespace, from the re-check that cleared this batch (fresh again when
    # that one is older than the re-check window); None: a walk of its own, now.
    in_use: Callable[[], Mapping[NsKey, str]] | None = None

    def busy(self) -> Mapping[NsKey, str]:
        """The namespaces that must stay right now, with why (reaper.host.nsmounts.in_use)."""
        return self.in_use() if self.in_use is not None else in_use(self.bin_dirs, self.netns_dirs)


class Kind(Struct, Generic[R], frozen=True, kw_only=True):
    """One kind of resource. Each module under reaper.kinds defines one as `KIND`."""

    name: str
    find: Callable[[Look], Found[R]]
    # Where it is on the node and what makes it the same one from one look to the next.
    identity: Callable[[R], Identity]
    # How it shows in a report (its identity inside).
    ref: Callable[[R], ResourceRef]
    # The key its producer gave it, which joins it to an attachment; None: it joins none.
    tie: Callable[[R], Tie | None]
    # Free what is still there, comparing before each delete; every record gets a Done.
    reclaim: Callable[[Sequence[R], ReclaimContext], Mapping[Identity, Done]]
    # What a later DEL would need (the cache entry): reclaimed after every other kind, and only
    # once the rest of its attachment is gone.
    last: bool = False
    # Its records are files that --quarantine-dir keeps instead of deleting.
    quarantinable: bool = False
    # A plugin's DEL can free its records (what plugins make). False for what the runtime or
    # libcni keeps, which DEL never removes: a namespace pin (the runtime's, CNI spec: the
    # runtime creates and destroys the netns) and the cache entry (libcni's, removed after DEL).
    # With `quarantinable` it says which reclaim methods the metrics can count.
    del_frees: bool = True
    # A DEL run as the runtime runs it needs these records besides the `last` ones (the pin is
    # its CNI_NETNS, and the veths live in it): kept while a chain that keeps state elsewhere
    # has not had that DEL succeed.
    del_needs: bool = False
    # For records whose tie is a Claim by key: the kind's key of an attachment
    # (container ID, network, ifname), recomputed as the producer computes it.
    key_of: Callable[[str, str, str], str] | None = None
    # The hooks below say what a record means to the reclaim path, so that it never asks what
    # type a record is. None: the kind's records have no such meaning.
    # Addresses the record says its attachment holds (a lease's, a cache entry's result's):
    # while that attachment is in use, no cached config's prevResult may name them.
    claims: Callable[[R], Iterable[str]] | None = None
    # Addresses that reclaiming the record frees (a lease, a firewall rule, the pod address a
    # masquerade chain's jumps match), as written: checked against every other namespace.
    frees: Callable[[R], Iterable[str]] | None = None
    # Whether the record is a kernel object that proves an attachment whose namespace is the
    # one given (a veth whose peer lives there). Files never do.
    proves: Callable[[R, NsKey | None], bool] | None = None
    # The network namespace the record keeps in being, and every address configured in it with
    # it (a pin's namespace; the one a host veth's peer lives in); None: it keeps none.
    keeps_netns: Callable[[R], NsKey | None] | None = None
    # Its records hand out or route an attachment's addresses (a lease; a rule that matches
    # them): reclaimed only once no namespace the attachment lives in stays (`keeps_netns`), so
    # that no address is free to hand out while a namespace on the node still holds it.
    with_addresses: bool = False

    def records(self, snapshot: NodeSnapshot) -> tuple[R, ...]:
        """The kind's records in a look."""
        return cast("tuple[R, ...]", snapshot.of(self.name))

    def record(self, ref: ResourceRef, records: Mapping[Identity, Any]) -> R | None:
        """The record `ref` names in `records` (a look's, by identity) when it is one of this kind's."""
        return cast("R | None", records.get(ref.identity)) if ref.kind == self.name else None


def batch_or_each(items: Mapping[Identity, T], run: Callable[[Sequence[T]], str | None]) -> dict[Identity, Done]:
    """Every item in one `run` (None: done, else why not); if that is refused, one run per item,
    so one bad item blocks no other."""
    if run(list(items.values())) is None:
        return {ident: Done.freed() for ident in items}
    return {
        ident: Done.left(why) if (why := run([item])) is not None else Done.freed() for ident, item in items.items()
    }


def owner_claim(container_id: str | None, network: str | None) -> Claim:
    """A Claim on the one owner a record's address has; with none, an empty Claim, which joins
    nothing: the record is reported unconfirmed and never reclaimed."""
    return Claim() if container_id is None else Claim(container_id=container_id, network=network)


def optional(**details: DetailValue) -> dict[str, DetailValue]:
    """The details given that are not None: a report shows only what a record has."""
    return {key: value for key, value in details.items() if value is not None}


def reclaim_order(kinds: Sequence[Kind[Any]]) -> tuple[Kind[Any], ...]:
    """The kinds in the order they are reclaimed: as registered, the `last` ones at the end.
    Every kind whose records keep a namespace (`keeps_netns`) goes before every kind
    `with_addresses`: whether a namespace stays is known before its addresses are freed."""
    order = tuple(k for k in kinds if not k.last) + tuple(k for k in kinds if k.last)
    keepers = [i for i, k in enumerate(order) if k.keeps_netns is not None]
    freers = [i for i, k in enumerate(order) if k.with_addresses]
    if keepers and freers and max(keepers) > min(freers):
        early, late = order[min(freers)].name, order[max(keepers)].name
        raise ValueError(f"kind {early} (with_addresses) is reclaimed before {late}, which keeps a netns")
    return order
