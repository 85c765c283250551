"""Every kind of resource the reaper knows, in the order they are found.

Adding a kind is a module under reaper.kinds that defines `KIND`, and one line here. A kind
is found after the ones above it (it may use what they found), and reclaimed in this order
too, except the `last` ones, which go after all the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reaper.kinds import (
    Kind,
    Pin,
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
from reaper.model import Identity, ResourceRef

KINDS: tuple[Kind[Any], ...] = (
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

KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
RECLAIM_ORDER: tuple[Kind[Any], ...] = reclaim_order(KINDS)
QUARANTINABLE: frozenset[str] = frozenset(k.name for k in KINDS if k.quarantinable)
BY_NAME: dict[str, Kind[Any]] = {k.name: k for k in KINDS}
# Kinds whose records a later DEL needs, reclaimed after all the rest.
LAST: frozenset[str] = frozenset(k.name for k in KINDS if k.last)


def pin_of(ref: ResourceRef, records: Mapping[Identity, Any]) -> Pin | None:
    """The resource as a namespace pin with a namespace mounted on it; None when it is none."""
    kind, record = BY_NAME.get(ref.kind), records.get(ref.identity)
    if kind is None or kind.pin is None or record is None:
        return None
    return kind.pin(record)
