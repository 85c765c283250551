"""The kinds contract: every registered kind meets it, the reclaim order keeps the cache entry
last, and a kind that is new to the reaper joins attachments and is reclaimed through the
registry alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from reaper.correlate import correlate
from reaper.kinds import Found, Kind, Look, ReclaimContext, reclaim_order
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import ContainerTie, Done, Identity, ResourceRef
from reaper.snapshot import take_snapshot
from tests.harness.passes import options_at
from tests.harness.snapshots import cache, chain, cid, lease, pin, runtime, snapshot, veth


def test_the_cache_entry_is_reclaimed_last_and_the_rest_in_registry_order() -> None:
    order = [k.name for k in REGISTRY.reclaim_order]
    assert order[0] == "tuning"  # registered first; not `last`
    rest = [
        "netns",
        "nspins",
        "heldns",  # reclaims nothing: its records are live mounts elsewhere
        "veth",
        "ipam",
        "firewall",
        "iprule",
        "iptables",
        "nft",
        "ifb",
        "flannel",
        "multus",
        "cache",
    ]
    assert order[1:] == rest
    assert [k.name for k in REGISTRY.kinds if k.last] == ["flannel", "multus", "cache"]
    assert {"ipam", "tuning", "flannel", "multus", "cache"} == REGISTRY.quarantinable


def test_every_kind_reports_its_records_under_their_identity() -> None:
    samples: dict[str, Any] = {"netns": pin(1), "veth": veth(1), "ipam": lease(1), "cache": cache(1)}
    samples["iptables"] = chain(1)
    for kind in REGISTRY.kinds:
        record = samples.get(kind.name)
        if record is None:
            continue
        ref = kind.ref(record)
        assert ref.kind == kind.name and ref.identity == kind.identity(record) and ref.identity[0] == kind.name


@dataclass(frozen=True)
class PluginState:
    """A per-container file some plugin leaves, keyed by the container ID alone."""

    container_id: str
    path: str


def _identity(state: PluginState) -> Identity:
    return ("plugin-state", state.path)


def _reclaim(states: Sequence[PluginState], ctx: ReclaimContext) -> dict[Identity, Done]:
    return {_identity(s): Done.freed() for s in states}


def _find(look: Look) -> Found[PluginState]:
    return Found(())


NEW_KIND: Kind[PluginState] = Kind(
    name="plugin-state",
    find=_find,
    identity=_identity,
    ref=lambda s: ResourceRef(kind="plugin-state", name=s.path, created_at=None, details={}, identity=_identity(s)),
    tie=lambda s: ContainerTie(s.container_id),
    reclaim=_reclaim,
)


def test_a_new_kind_joins_the_attachment_of_its_container() -> None:
    kinds = (*REGISTRY.kinds, NEW_KIND)
    base = snapshot(pins=(pin(1),), leases=(lease(1),), caches=(cache(1),))
    state = PluginState(cid(1), "/var/lib/cni/plugin-state/x")
    snap = replace(base, resources={**base.resources, "plugin-state": (state,)})
    (group,) = correlate(snap, runtime(), Registry(kinds=kinds)).groups
    assert group.key.container_id == cid(1)
    assert sorted(r.kind for r in group.resources) == ["cache", "ipam", "netns", "plugin-state"]
    # Registered like the others, it is reclaimed with them, before the `last` ones.
    assert [k.name for k in reclaim_order(kinds)][-4:] == ["plugin-state", "flannel", "multus", "cache"]
    assert "plugin-state" not in REGISTRY.names


def test_kinds_are_found_in_registry_order_each_seeing_those_before(tmp_path: Path) -> None:
    """Each kind sees the records of those before it, in the registry's order."""
    seen: list[tuple[str, list[str]]] = []

    def kind(name: str) -> Kind[PluginState]:
        def find(look: Look) -> Found[PluginState]:
            seen.append((name, sorted(look.earlier)))
            return Found(())

        return replace(NEW_KIND, name=name, find=find)

    kinds = (kind("first"), kind("dump"), kind("second"))
    take_snapshot(options_at(tmp_path), registry=Registry(kinds=kinds))
    assert seen == [("first", []), ("dump", ["first"]), ("second", ["dump", "first"])]


def test_a_look_gives_the_records_of_a_kind_found_before_typed_and_none_of_a_later_one(tmp_path: Path) -> None:
    """look.found(kind): the records of a kind found earlier in the look; empty for one not found yet."""
    record = PluginState(cid(1), "/var/lib/cni/plugin-state/a")
    first: Kind[PluginState] = replace(NEW_KIND, name="first", find=lambda _look: Found((record,)))
    later = replace(NEW_KIND, name="later")
    got: list[tuple[tuple[PluginState, ...], tuple[PluginState, ...]]] = []

    def find(look: Look) -> Found[PluginState]:
        got.append((look.found(first), look.found(later)))
        return Found(())

    take_snapshot(
        options_at(tmp_path), registry=Registry(kinds=(first, replace(NEW_KIND, name="reader", find=find), later))
    )
    assert got == [((record,), ())]
