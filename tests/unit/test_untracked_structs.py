"""The records a pass makes one of per resource are left out of the cyclic garbage collector
(msgspec's `gc=False`): the agent holds the last pass's records while the next one makes its
own, and every full collection walked them all. An untracked object in a reference cycle would
never be freed, so an untracked struct may hold only values that cannot lead back to it:
strings, numbers, tuples and dicts of those, and other untracked structs."""

from __future__ import annotations

import gc
import importlib
import pkgutil

import msgspec
import msgspec.inspect as mi
import pytest

import reaper
from reaper.correlate import ResourceGroup
from reaper.host.mounts import MountLine
from reaper.kinds.cache import CacheEntry
from reaper.kinds.hostlocal import HostLocalLease
from reaper.kinds.iptables import IptablesChain
from reaper.kinds.netns import NetnsPin
from reaper.kinds.veth import VethLink
from reaper.model import (
    Attachment,
    AttachmentHistory,
    AttachmentKey,
    BesidePin,
    Claim,
    ContainerTie,
    HeldTie,
    NetnsTie,
    NsKey,
    OwnKey,
    PeerTie,
    ResourceRef,
)

NS = NsKey(1, 2)
# One of each record a pass makes per resource, per attachment or per mount line.
PER_RECORD: tuple[msgspec.Struct, ...] = (
    OwnKey(container_id="c", network="n", ifname="eth0", netns=NS),
    ContainerTie("c"),
    NetnsTie(NS, "/run/netns/x", True),
    PeerTie("veth0", NS),
    Claim("c"),
    BesidePin("/run/netns/x"),
    HeldTie(NS, "/proc/1/root/x"),
    ResourceRef(kind="netns", name="x", created_at=None, details={"path": "/run/netns/x"}, identity=("netns", "x")),
    AttachmentKey("c", "n", "eth0"),
    Attachment(key=AttachmentKey("c", "n", "eth0"), resources=(), netns=NS, verdict="live", reason="r", age_seconds=0),
    AttachmentHistory(1.0, 0),
    ResourceGroup(key=AttachmentKey("c", "n", "eth0"), resources=(), netns=NS, foreign=False),
    MountLine(1, 0, 3, "net:[4]", "/run/netns/x", ("shared:1",), "nsfs"),
    CacheEntry(
        path="/var/lib/cni/cache/results/n-c-eth0",
        name="n-c-eth0",
        container_id="c",
        network="n",
        ifname="eth0",
        netns_path=None,
        netns=None,
        host_ifnames=(),
        legacy=False,
        mtime=1.0,
        cache_dir="/var/lib/cni/cache",
    ),
    NetnsPin(
        name="x", path="/run/netns/x", directory="/run/netns", ns=NS, is_namespace=True, mtime=1.0, runtime_named=True
    ),
    VethLink(ifindex=3, name="veth0", peer_ifindex=2, peer_netnsid=0, master=None, peer_netns=NS),
    IptablesChain(
        family="ipv4",
        table="nat",
        chain="CNI-x",
        purpose="masquerade",
        network="n",
        container_id="c",
        rules=(),
        jumps=(),
    ),
    HostLocalLease(network="n", ip="10.0.0.2", container_id="c", ifname="eth0", path="/x", data_dir="/d", mtime=1.0),
)


@pytest.mark.parametrize("record", PER_RECORD, ids=lambda r: type(r).__name__)
def test_a_per_record_struct_is_not_tracked(record: msgspec.Struct) -> None:
    assert not gc.is_tracked(record)


def _untracked_structs() -> list[type[msgspec.Struct]]:
    for module in pkgutil.walk_packages(reaper.__path__, "reaper."):
        importlib.import_module(module.name)
    found: list[type[msgspec.Struct]] = []
    todo: list[type[msgspec.Struct]] = [msgspec.Struct]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("reaper.") and not sub.__struct_config__.gc:
                found.append(sub)
    return found


def _acyclic(kind: mi.Type) -> bool:
    """Whether a value of `kind` can hold nothing that leads back to what holds it."""
    if isinstance(kind, mi.StrType | mi.IntType | mi.FloatType | mi.BoolType | mi.NoneType | mi.LiteralType):
        return True
    if isinstance(kind, mi.UnionType):
        return all(_acyclic(t) for t in kind.types)
    if isinstance(kind, mi.VarTupleType):
        return _acyclic(kind.item_type)
    if isinstance(kind, mi.TupleType):
        return all(_acyclic(t) for t in kind.item_types)
    if isinstance(kind, mi.NamedTupleType):
        return all(_acyclic(f.type) for f in kind.fields)
    if isinstance(kind, mi.DictType):
        return _acyclic(kind.key_type) and _acyclic(kind.value_type)
    if isinstance(kind, mi.StructType):
        return not kind.cls.__struct_config__.gc and all(_acyclic(f.type) for f in kind.fields)
    return False


def test_an_untracked_struct_holds_only_what_cannot_lead_back_to_it() -> None:
    untracked = _untracked_structs()
    assert {type(r) for r in PER_RECORD} <= set(untracked)
    for cls in untracked:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        assert [f.name for f in info.fields if not _acyclic(f.type)] == [], cls.__qualname__
