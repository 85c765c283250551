"""One look at the node: every kind's find, in the registry's order, timed, failures as data;
for a pass (look_at_node), then who is in each namespace, all before any runtime is asked."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Set
from typing import Any

from msgspec.structs import replace

from reaper.correlate import Ties, tie_all
from reaper.host.memo import InventoryMemo
from reaper.host.procs import describe, netns_members, unseen_processes
from reaper.kinds import Found, Look, hostlocal
from reaper.kinds.hostlocal import range_usage
from reaper.kinds.netconf import collect_configs_of
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import HostUnseen, NetworkConfig, NodeSnapshot, NsKey, SourceError
from reaper.options import FindOptions
from reaper.stopwatch import Stopwatch

HOST_NETNS_PATHS = ("/proc/1/ns/net", "/proc/2/ns/net")


def host_netns(paths: tuple[str, ...] = HOST_NETNS_PATHS) -> NsKey:
    """The host's network namespace; HostUnseen when none of `paths` can be looked at (a user
    other than root may not stat another user's /proc/<pid>/ns, ptrace's rule)."""
    # pid 1's may be unreadable (a protected init); kthreadd (pid 2) is always in init_net.
    said = ""
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as err:
            said = said or f"{path}: {err.strerror}"
            continue
        return NsKey(st.st_dev, st.st_ino)
    raise HostUnseen(
        f"cannot tell the host's network namespace ({said}): run as root, in the host's PID namespace "
        "(hostPID), with its /proc"
    )


NetnsMembers = list[tuple[NsKey, list[int]]]


def walk_processes() -> NetnsMembers:
    """Every namespace some process is in, with their pids: one walk of /proc, every thread of every process."""
    return [(ns, sorted(pids)) for ns, pids in netns_members().items()]


def with_processes(snapshot: NodeSnapshot, walk: Callable[[], NetnsMembers] = walk_processes) -> NodeSnapshot:
    """The snapshot with who is in each namespace but the host's, and what could not be seen. A
    walk with no whole answer leaves every process unseen (so every attachment with a netns is
    undecided) and is a failed source in the report."""
    errors = snapshot.errors
    try:
        members, unseen = walk(), unseen_processes()
    except OSError as err:
        members, unseen = [], f"the walk of /proc failed ({err}): the processes that hold a netns cannot be seen"
        errors = (*errors, SourceError("processes", unseen))
    return replace(
        snapshot,
        netns_pids=tuple(sorted((ns, tuple(pids)) for ns, pids in members if ns != snapshot.host_netns)),
        unseen_processes=unseen,
        errors=errors,
    )


def with_holders(snapshot: NodeSnapshot, wanted: Set[NsKey], bin_dirs: tuple[str, ...]) -> NodeSnapshot:
    """The snapshot with the processes in the `wanted` namespaces described (what tells a
    plugin's ADD in progress from a resident); a namespace no record names decides nothing."""
    kept = [(ns, pids) for ns, pids in snapshot.netns_pids if ns in wanted]
    described = describe({pid for _, pids in kept for pid in pids}, bin_dirs)
    return replace(snapshot, netns_holders=tuple((ns, tuple(described[pid] for pid in pids)) for ns, pids in kept))


def look_at_node(
    opts: FindOptions, memo: InventoryMemo | None = None, registry: Registry = REGISTRY
) -> tuple[NodeSnapshot, Ties]:
    """A pass's look, read once before any runtime is asked: every kind's records, their ties,
    who is in each namespace, and those processes described in every namespace a record ties
    to (the runtimes' answer, not known yet, cannot narrow that). The re-check before
    reclaiming looks again with take_snapshot and its own /proc walk (reaper.reap.act)."""
    snapshot = take_snapshot(opts, memo, registry)
    watch = Stopwatch()
    ties = tie_all(snapshot, registry)
    watch.lap("ties")
    snapshot = with_processes(snapshot)
    watch.lap("processes")
    snapshot = with_holders(snapshot, ties.namespaces(), opts.bin_dirs)
    watch.lap("holders")
    return replace(snapshot, timings=(*snapshot.timings, *watch.laps)), ties


def take_snapshot(opts: FindOptions, memo: InventoryMemo | None = None, registry: Registry = REGISTRY) -> NodeSnapshot:
    """Look at the node. `memo` carries parsed files from pass to pass in a long-running agent."""
    taken_at = time.time()
    watch = Stopwatch()
    memo = memo if memo is not None else InventoryMemo()
    memo.start_pass()
    conf_configs, corrupt = collect_configs_of(opts.conf_dirs)
    configs: list[NetworkConfig] = list(conf_configs)  # one per network: the conf dirs' win
    watch.lap("configs")
    host = host_netns()
    errors: list[SourceError] = []
    partly_read: set[str] = set()
    found: dict[str, tuple[Any, ...]] = {}
    for kind in registry.kinds:
        # Only the node's own configs: a path in a cached one is whatever the cache's writer wanted.
        look = Look(opts, memo, tuple(conf_configs), dict(found))
        try:
            result = kind.find(look)
        except Exception as err:  # a bug costs that kind only
            # Fewer records never make a live attachment orphaned: a missing one goes unreclaimed.
            result = Found((), errors=(SourceError(kind.name, f"failed unexpectedly: {type(err).__name__}: {err}"),))
        found[kind.name] = result.records
        corrupt.extend(result.corrupt)
        errors.extend(result.errors)
        if result.errors:
            partly_read.add(kind.name)
        named = {c.name for c in configs}
        configs.extend(c for c in result.configs if c.name not in named)
        watch.lap(kind.name)
    ranges = range_usage(configs, found.get(hostlocal.KIND.name, ()), opts.pod_cidrs)
    watch.lap("ranges")
    memo.end_pass()
    return NodeSnapshot(
        taken_at=taken_at,
        host_netns=host,
        resources=found,
        ranges=tuple(ranges),
        configs=tuple(configs),
        corrupt=tuple(corrupt),
        errors=tuple(errors),
        timings=tuple(watch.laps),
        partly_read=frozenset(partly_read),
    )
