"""One look at the node: every collector, in an order that lets each use the last's findings."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from reaper.inventory.cache import collect_cache
from reaper.inventory.hostlocal import collect_leases, range_usage
from reaper.inventory.iptables import ChainCollector
from reaper.inventory.links import RawLink, dump_links_and_nsids
from reaper.inventory.memo import InventoryMemo
from reaper.inventory.netconf import collect_configs
from reaper.inventory.netns import collect_pins
from reaper.inventory.nftables import collect_nft_rules
from reaper.inventory.procs import describe, netns_members
from reaper.model import NetnsPin, NodeSnapshot, NsKey, SourceError, VethLink


@dataclass(frozen=True)
class InventoryOptions:
    netns_dirs: tuple[str, ...]
    ipam_dirs: tuple[str, ...]
    cache_dir: str
    conf_dir: str
    bin_dirs: tuple[str, ...]
    netns_patterns: tuple[re.Pattern[str], ...]
    command_timeout: float = 30.0


def _host_netns() -> NsKey:
    # pid 1's may be unreadable (a protected init); kthreadd (pid 2) is always in init_net.
    for path in ("/proc/1/ns/net", "/proc/2/ns/net"):
        try:
            st = os.stat(path)
        except OSError:
            continue
        return NsKey(st.st_dev, st.st_ino)
    raise OSError("cannot stat /proc/1/ns/net or /proc/2/ns/net to identify the host netns")


def _veths(links: list[RawLink], nsids: dict[str, int], pins: list[NetnsPin]) -> list[VethLink]:
    by_index = {link.ifindex: link.name for link in links}
    pin_ns = {pin.path: pin.ns for pin in pins}
    nsid_to_ns = {nsid: pin_ns[path] for path, nsid in nsids.items() if path in pin_ns}
    veths = []
    for link in links:
        if link.kind != "veth":
            continue
        peer_ns = nsid_to_ns.get(link.link_netnsid) if link.link_netnsid is not None else None
        veths.append(
            VethLink(
                ifindex=link.ifindex,
                name=link.name,
                peer_ifindex=link.link,
                peer_netnsid=link.link_netnsid,
                master=by_index.get(link.master) if link.master else None,
                peer_netns=peer_ns,
            )
        )
    return veths


class _Stopwatch:
    def __init__(self) -> None:
        self.laps: list[tuple[str, float]] = []
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, round(now - self._last, 6)))
        self._last = now


def take_snapshot(opts: InventoryOptions, memo: InventoryMemo | None = None) -> NodeSnapshot:
    """Look at the node. `memo` carries parsed files from pass to pass in a long-running agent."""
    taken_at = time.time()
    watch = _Stopwatch()
    memo = memo if memo is not None else InventoryMemo()
    iptables = ChainCollector(opts.command_timeout)
    try:
        snapshot = _take(opts, taken_at, watch, iptables, memo)
    finally:
        iptables.close()
    memo.end_pass()
    return snapshot


def _take(
    opts: InventoryOptions, taken_at: float, watch: _Stopwatch, iptables: ChainCollector, memo: InventoryMemo
) -> NodeSnapshot:
    configs, corrupt = collect_configs(opts.conf_dir)
    watch.lap("configs")
    cache = collect_cache(opts.cache_dir, {c.name for c in configs}, memo.cache)
    corrupt.extend(cache.corrupt)
    watch.lap("cache")
    host = _host_netns()
    members = {ns: pids for ns, pids in netns_members().items() if ns != host}
    described = describe({pid for pids in members.values() for pid in pids}, opts.bin_dirs)
    holders = {ns: tuple(described[pid] for pid in sorted(pids)) for ns, pids in members.items()}
    watch.lap("processes")
    pins, pin_corrupt = collect_pins(opts.netns_dirs, holders, opts.netns_patterns)
    corrupt.extend(pin_corrupt)
    watch.lap("netns")
    errors: list[SourceError] = []

    named_veths = {name for entry in cache.entries for name in entry.host_ifnames}
    real_pins = [pin.path for pin in pins if pin.is_namespace]

    def choose_pins(links: list[RawLink]) -> list[str]:
        # A veth named in a cache entry joins its attachment by name; only the others need
        # their peer's namespace, and finding it costs a netlink request per pin.
        unexplained = any(
            link.kind == "veth" and link.link_netnsid is not None and link.name not in named_veths for link in links
        )
        return real_pins if unexplained else []

    try:
        links, nsids = dump_links_and_nsids(choose_pins)
    except OSError as err:
        links, nsids = [], {}
        errors.append(SourceError("netlink", str(err)))
    veths = _veths(links, nsids, pins)
    watch.lap("links")

    all_configs = configs + [c for c in cache.configs if c.name not in {x.name for x in configs}]
    data_dirs = list(opts.ipam_dirs)
    for config in configs + list(cache.configs):
        data_dirs.extend(d for d in config.ipam_data_dirs if d not in data_dirs)
    leases, lease_corrupt = collect_leases(data_dirs, memo.leases)
    corrupt.extend(lease_corrupt)
    ranges = range_usage(all_configs, leases)
    watch.lap("ipam")

    chains, chain_errors = iptables.result()
    errors.extend(chain_errors)
    watch.lap("iptables")
    nft_rules, nft_errors = collect_nft_rules(opts.command_timeout)
    errors.extend(nft_errors)
    watch.lap("nftables")

    return NodeSnapshot(
        taken_at=taken_at,
        host_netns=host,
        pins=tuple(pins),
        veths=tuple(veths),
        leases=tuple(leases),
        ranges=tuple(ranges),
        cache_entries=cache.entries,
        chains=tuple(chains),
        nft_rules=tuple(nft_rules),
        configs=tuple(all_configs),
        corrupt=tuple(corrupt),
        errors=tuple(errors),
        netns_holders=tuple(sorted(holders.items())),
        timings=tuple(watch.laps),
    )
