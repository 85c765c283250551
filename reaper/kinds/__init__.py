"""Resource kinds: the contract each one meets (`Kind`), and helpers several kinds share.

A kind's module owns everything known about it: how it is found, its identity, the producer's
key that ties it to an attachment, and how it is reclaimed with a compare before every delete,
by the same reader that found it. reaper.kinds.registry lists the kinds; docs/design.md, "In
depth: the kinds".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

from msgspec import Struct

from reaper.host.memo import InventoryMemo
from reaper.host.netlink import RawLink, delete_links
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
    # Who is in which namespace, from the re-check that cleared this batch (walked again past
    # the re-check window); None: a walk of its own, now.
    in_use: Callable[[], Mapping[NsKey, str]] | None = None

    def busy(self) -> Mapping[NsKey, str]:
        """The namespaces that must stay right now, with why (reaper.host.nsmounts.in_use)."""
        return self.in_use() if self.in_use is not None else in_use(self.bin_dirs, self.netns_dirs)


class Kind(Struct, Generic[R], frozen=True, kw_only=True):
    """One kind of resource. Each module under reaper.kinds defines one as `KIND`."""

    name: str
    find: Callable[[Look], Found[R]]
    identity: Callable[[R], Identity]  # where it is, and what makes it the same one look to look
    ref: Callable[[R], ResourceRef]  # how a report shows it (its identity inside)
    tie: Callable[[R], Tie | None]  # its producer's key, which joins it to an attachment; None: none
    # Free what is still there, comparing before each delete; every record gets a Done.
    reclaim: Callable[[Sequence[R], ReclaimContext], Mapping[Identity, Done]]
    # What a later DEL needs (the cache entry): reclaimed after every other kind, and only once
    # the rest of its attachment is gone.
    last: bool = False
    quarantinable: bool = False  # files that --quarantine-dir keeps instead of deleting
    # A plugin's DEL can free its records. False for the runtime's namespace pin (CNI spec: the
    # runtime creates and destroys the netns) and libcni's cache entry (removed after DEL). With
    # `quarantinable`, it says which reclaim methods the metrics count.
    del_frees: bool = True
    # A DEL as the runtime runs it needs these besides the `last` ones (the pin is its CNI_NETNS,
    # the veths live in it): kept while a chain that keeps state elsewhere has not had it succeed.
    del_needs: bool = False
    # For a Claim by key: an attachment's key from (container ID, network, ifname), as its producer computes it.
    key_of: Callable[[str, str, str], str] | None = None
    # What a record means to the reclaim path, which never asks what type a record is (None:
    # nothing). `claims`: addresses its attachment holds, which no cached prevResult may name
    # while that attachment is in use. `frees`: addresses reclaiming it frees, as written,
    # checked against every other namespace. `proves`: whether it is a kernel object proving an
    # attachment in the namespace given (files never do). `keeps_netns`: the namespace it keeps
    # in being, with every address in it (a pin's; a host veth's peer's).
    claims: Callable[[R], Iterable[str]] | None = None
    frees: Callable[[R], Iterable[str]] | None = None
    proves: Callable[[R, NsKey | None], bool] | None = None
    keeps_netns: Callable[[R], NsKey | None] | None = None
    # It hands out or routes an attachment's addresses (a lease; a rule matching them): reclaimed
    # only once no namespace the attachment lives in stays, so no address a namespace on the
    # node still holds is free to hand out.
    with_addresses: bool = False

    def records(self, snapshot: NodeSnapshot) -> tuple[R, ...]:
        return cast("tuple[R, ...]", snapshot.of(self.name))

    def record(self, ref: ResourceRef, records: Mapping[Identity, Any]) -> R | None:
        """The record `ref` names in `records` (a look's, by identity) when it is one of this kind's."""
        return cast("R | None", records.get(ref.identity)) if ref.kind == self.name else None


def batch_or_each(items: Mapping[Identity, T], run: Callable[[Sequence[T]], str | None]) -> dict[Identity, Done]:
    """All items in one `run` (None: done, else why not); if refused, one run each, so no bad item blocks another."""
    if run(list(items.values())) is None:
        return {ident: Done.freed() for ident in items}
    return {
        ident: Done.left(why) if (why := run([item])) is not None else Done.freed() for ident, item in items.items()
    }


def owner_claim(container_id: str | None, network: str | None) -> Claim:
    """With no owner, an empty Claim: it joins nothing, so the record is reported unconfirmed, never reclaimed."""
    return Claim() if container_id is None else Claim(container_id=container_id, network=network)


class OnLink(Protocol):
    """A record of a link in the netns the reaper runs in."""

    @property
    def ifindex(self) -> int: ...


L = TypeVar("L", bound=OnLink)


def delete_by_index(
    records: Sequence[L],
    now: Mapping[int, RawLink],
    identity: Callable[[L], Identity],
    changed: Callable[[L, RawLink], bool],
    kept: Callable[[L], str | None] = lambda _: None,
) -> dict[Identity, Done]:
    """Delete each record's link by its index, as the links are `now`: only while that index is
    not another link (`changed`) and nothing keeps it (`kept` says why)."""
    done: dict[Identity, Done] = {}
    to_delete: dict[int, L] = {}
    for record in records:
        link = now.get(record.ifindex)
        why = kept(record)
        if link is None:
            done[identity(record)] = Done.freed()  # gone (a veth: with its namespace)
        elif changed(record, link):
            done[identity(record)] = Done.left("index now belongs to another link; left alone")
        elif why is not None:
            done[identity(record)] = Done.left(why)
        else:
            to_delete[record.ifindex] = record
    for index, error in delete_links(list(to_delete)).items() if to_delete else ():
        done[identity(to_delete[index])] = Done.freed() if error is None else Done.left(error)
    return done


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
