"""Every kind of resource the reaper knows, in the order they are found, as one value.

Adding a kind is a module under reaper.kinds that defines `KIND`, and one line here. A kind is
found after the ones above it (it may use what they found), and reclaimed in this order too
(reclaim_order). The look, the correlation, the plan and the reclaimer are each given a
`Registry` (REGISTRY unless a caller says otherwise), as libcni's CNIConfig its Exec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

from reaper.kinds import (
    Kind,
    bandwidth,
    cache,
    firewall,
    flannel,
    heldns,
    hostlocal,
    iprules,
    iptables,
    multus,
    netns,
    nftables,
    nspins,
    reclaim_order,
    tuning,
    veth,
)
from reaper.kinds.netns import NetnsPin, Pin
from reaper.model import Identity, ResourceRef


@dataclass(frozen=True)
class Registry:
    """The kinds, and what follows from them. `pins`: the kind whose records are the runtime's
    namespace pins (what DEL is given as CNI_NETNS, and kernel evidence of an attachment)."""

    kinds: tuple[Kind[Any], ...]
    pins: Kind[NetnsPin] = netns.KIND

    def __post_init__(self) -> None:
        _ = self.reclaim_order  # an order that frees an address before its namespace is refused here

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.kinds)

    @cached_property
    def reclaim_order(self) -> tuple[Kind[Any], ...]:
        return reclaim_order(self.kinds)

    @cached_property
    def by_name(self) -> Mapping[str, Kind[Any]]:
        return MappingProxyType({k.name: k for k in self.kinds})

    @cached_property
    def last(self) -> frozenset[str]:
        return frozenset(k.name for k in self.kinds if k.last)

    @cached_property
    def quarantinable(self) -> frozenset[str]:
        return frozenset(k.name for k in self.kinds if k.quarantinable)

    def pin_of(self, ref: ResourceRef, records: Mapping[Identity, Any]) -> Pin | None:
        """The resource as a namespace pin with a namespace mounted on it; None when it is none."""
        pin = self.pins.record(ref, records)
        return netns.as_pin(pin) if pin is not None else None


REGISTRY = Registry(
    kinds=(
        tuning.KIND,  # not last: its DEL needs the netns, and without one the file serves none
        flannel.KIND,  # last, like the cache entry, but before it: the cache entry stays the very last
        multus.KIND,  # the same
        cache.KIND,
        netns.KIND,
        nspins.KIND,  # after the netns: reclaimed only once its sandbox's netns pin is
        heldns.KIND,  # before the veths: a veth whose peer is in a namespace held elsewhere is tied to it
        veth.KIND,  # uses the pins and the cache entries
        hostlocal.KIND,  # uses the data dirs in the configs the cache entries carry
        firewall.KIND,  # uses the leases and the cache entries
        iprules.KIND,  # the same
        iptables.KIND,
        nftables.KIND,
        bandwidth.KIND,
    )
)
