"""Every kind of resource the reaper knows, in the order they are found.

Adding a kind is a module under reaper.kinds that defines `KIND`, and one line here. A kind
is found after the ones above it (it may use what they found), and reclaimed in this order
too, except the `last` ones, which go after all the rest.
"""

from __future__ import annotations

from typing import Any

from reaper.kinds import Kind, cache, hostlocal, iptables, netns, nftables, reclaim_order, veth

KINDS: tuple[Kind[Any], ...] = (
    cache.KIND,
    netns.KIND,
    veth.KIND,  # uses the pins and the cache entries
    hostlocal.KIND,  # uses the data dirs in the configs the cache entries carry
    iptables.KIND,
    nftables.KIND,
)

KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
RECLAIM_ORDER: tuple[Kind[Any], ...] = reclaim_order(KINDS)
QUARANTINABLE: frozenset[str] = frozenset(k.name for k in KINDS if k.quarantinable)
