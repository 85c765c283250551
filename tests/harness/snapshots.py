"""Builders of synthetic snapshots and runtime views for tests of the pure logic."""

from __future__ import annotations

from reaper.kinds.cache import CacheEntry
from reaper.kinds.hostlocal import HostLocalLease
from reaper.kinds.iptables import IptablesChain
from reaper.kinds.netns import NetnsPin
from reaper.kinds.veth import VethLink
from reaper.model import NodeSnapshot, NsKey, Policy, RuntimeView, Sandbox

HOST = NsKey(4, 4026531833)
NET = "mynet"
# The clock and the policy reconcile's tests judge synthetic snapshots by: OLD is past min_age.
NOW = 10_000.0
POLICY = Policy(min_age=600.0, confirmations=2, stuck_after=900.0)
OLD = NOW - 3600.0


def cid(n: int) -> str:
    return f"{n:064x}"


def pin(n: int, mtime: float = 0.0, runtime_named: bool = True, name: str | None = None) -> NetnsPin:
    return NetnsPin(
        name=name or f"cni-{n:08x}-0000-0000-0000-000000000000",
        path=f"/run/netns/{name or n}",
        directory="/run/netns",
        ns=NsKey(4, 1000 + n),
        is_namespace=True,
        mtime=mtime,
        runtime_named=runtime_named,
    )


def lease(n: int, mtime: float = 0.0, ifname: str | None = "eth0", net: str = NET) -> HostLocalLease:
    return HostLocalLease(
        network=net,
        ip=f"10.0.{n // 250}.{n % 250 + 2}",
        container_id=cid(n),
        ifname=ifname,
        path=f"/ipam/{net}/{n}",
        data_dir="/ipam",
        mtime=mtime,
    )


def cache(n: int, mtime: float = 0.0, with_netns: bool = True, net: str = NET) -> CacheEntry:
    return CacheEntry(
        path=f"/cache/results/{net}-{cid(n)}-eth0",
        name=f"{net}-{cid(n)}-eth0",
        container_id=cid(n),
        network=net,
        ifname="eth0",
        netns_path=f"/run/netns/{n}" if with_netns else None,
        netns=NsKey(4, 1000 + n) if with_netns else None,
        host_ifnames=(f"veth{n:08x}",),
        legacy=False,
        mtime=mtime,
        cache_dir="/cache",
    )


def veth(n: int, resolved: bool = True) -> VethLink:
    return VethLink(
        ifindex=100 + n,
        name=f"veth{n:08x}",
        peer_ifindex=2,
        peer_netnsid=n,
        master="cni0",
        peer_netns=NsKey(4, 1000 + n) if resolved else None,
    )


def chain(n: int, net: str = NET) -> IptablesChain:
    return IptablesChain(
        family="ipv4",
        table="nat",
        chain=f"CNI-{n:024x}",
        purpose="masquerade",
        network=net,
        container_id=cid(n),
        rules=(),
        jumps=(),
    )


def snapshot(
    pins: tuple[NetnsPin, ...] = (),
    veths: tuple[VethLink, ...] = (),
    leases: tuple[HostLocalLease, ...] = (),
    caches: tuple[CacheEntry, ...] = (),
    chains: tuple[IptablesChain, ...] = (),
    taken_at: float = 10_000.0,
) -> NodeSnapshot:
    return NodeSnapshot(
        taken_at=taken_at,
        host_netns=HOST,
        resources={"netns": pins, "veth": veths, "ipam": leases, "cache": caches, "iptables": chains},
        ranges=(),
        configs=(),
        corrupt=(),
        errors=(),
    )


def sandbox(n: int, ready: bool = True, created_at: float = 0.0, with_netns: bool = True) -> Sandbox:
    return Sandbox(
        id=cid(n),
        name=f"pod-{n}",
        namespace="default",
        uid=f"uid-{n}",
        ready=ready,
        created_at=created_at,
        netns_path=f"/run/netns/{n}" if with_netns else None,
        netns=NsKey(4, 1000 + n) if with_netns else None,
    )


def runtime(*sandboxes: Sandbox, reachable: bool = True) -> RuntimeView:
    return RuntimeView(
        endpoint="unix:///test.sock",
        name="test",
        version="1",
        reachable=reachable,
        error=None if reachable else "connection refused",
        sandboxes=sandboxes if reachable else (),
    )
