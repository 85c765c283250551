"""AWS VPC CNI's per-pod routing policy rules (`pod_rule`), in the netns the reaper runs in.

The rule carries only the address: the tie is a Claim on the one container (on one network)
whose leases and cached results hold it, else an empty Claim. Which rules are records, and when
one goes: docs/design.md, "In depth: the kinds".
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence

from msgspec import Struct
from msgspec.structs import replace

from reaper.cni.result import address_key
from reaper.host.netlink import FR_ACT_TO_TBL, RawRule, delete_rules, dump_rules
from reaper.kinds import Found, Kind, Look, ReclaimContext, cache, hostlocal, owner_claim
from reaper.kinds.cache import CacheEntry
from reaper.kinds.hostlocal import HostLocalLease
from reaper.model import Claim, DetailValue, Done, Identity, ResourceRef, SourceError

KIND_NAME = "iprule"
TO_POD_PRIORITY = 512  # `to <podIP> lookup main`
FROM_POD_PRIORITY = 1536  # `from <podIP> lookup <ENI table>`
MAIN_TABLE = 254
# Tables no ENI's is: unspec, default, main, local.
_RESERVED_TABLES = frozenset({0, 253, MAIN_TABLE, 255})
_FULL: dict[int, int] = {socket.AF_INET: 32, socket.AF_INET6: 128}
_FAMILY: dict[int, str] = {socket.AF_INET: "ipv4", socket.AF_INET6: "ipv6"}


class PodRule(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One of the AWS VPC CNI plugin's rules for a pod address."""

    rule: RawRule
    ip: str  # the selector's address, as inet_ntop prints it
    direction: str  # "to" (priority 512) or "from" (priority 1536)
    # The owner, by what holds its address: none when no single container does.
    container_id: str | None = None
    network: str | None = None
    # Every lease holding its address when it was found, as the ipam kind identifies them.
    leases: tuple[Identity, ...] = ()
    owner: str = "not looked up"  # whose it is, or why it is no one's, in words


def _plain(rule: RawRule) -> bool:
    """Whether the rule selects by its addresses only, and looks a table up."""
    return (
        rule.action == FR_ACT_TO_TBL
        and rule.flags == 0
        and rule.tos == 0
        and rule.suppress_prefixlen is None
        and not rule.other
    )


def pod_rule(rule: RawRule) -> PodRule | None:
    """The rule as the plugin's, when it is exactly one of its two shapes; else None."""
    full = _FULL.get(rule.family)
    if full is None or not _plain(rule):
        return None
    to_pod = rule.priority == TO_POD_PRIORITY and rule.table == MAIN_TABLE
    if to_pod and rule.src is None and rule.src_len == 0 and rule.dst is not None and rule.dst_len == full:
        return PodRule(rule=rule, ip=rule.dst, direction="to")
    from_pod = rule.priority == FROM_POD_PRIORITY and rule.table not in _RESERVED_TABLES
    if from_pod and rule.dst is None and rule.dst_len == 0 and rule.src is not None and rule.src_len == full:
        return PodRule(rule=rule, ip=rule.src, direction="from")
    return None


def pod_rules(rules: Iterable[RawRule]) -> list[PodRule]:
    return [p for p in (pod_rule(r) for r in rules) if p is not None]


def _selector(r: RawRule) -> tuple[object, ...]:
    """What a delete names a rule by (priority, table, selector): it could take any rule with these."""
    return (r.family, r.priority, r.table, r.src, r.src_len, r.dst, r.dst_len)


def with_owners(
    rules: Iterable[PodRule], leases: Iterable[HostLocalLease], caches: Iterable[CacheEntry]
) -> list[PodRule]:
    """Each rule with the owner of its address: the one container (on one network) whose
    host-local leases and cached results hold it. Held by none, or by more than one, it has none."""
    rules = list(rules)
    if not rules:  # the common case: no AWS VPC CNI here, so no address index is built
        return []
    holders: dict[tuple[int, int], set[tuple[str, str]]] = {}
    held_by: dict[tuple[int, int], list[HostLocalLease]] = {}
    for lease in leases:
        key = address_key(lease.ip)
        if key is not None:
            holders.setdefault(key, set()).add((lease.container_id, lease.network))
            held_by.setdefault(key, []).append(lease)
    for entry in caches:
        for ip in entry.ips:
            key = address_key(ip)
            if key is not None:
                holders.setdefault(key, set()).add((entry.container_id, entry.network))
    out = []
    for rule in rules:
        key = address_key(rule.ip)
        owners = holders.get(key, set()) if key is not None else set()
        leases_of = tuple(hostlocal.identity(lease) for lease in held_by.get(key, [])) if key is not None else ()
        if not owners:
            out.append(replace(rule, leases=leases_of, owner=f"no lease or cached result holds {rule.ip}"))
        elif len(owners) > 1:
            who = ", ".join(sorted(f"{cid[:12]} on {net}" for cid, net in owners))
            out.append(replace(rule, leases=leases_of, owner=f"{rule.ip} is held by {len(owners)}: {who}"))
        else:
            ((cid, net),) = owners
            out.append(replace(rule, container_id=cid, network=net, leases=leases_of, owner=f"{cid[:12]} on {net}"))
    return out


def find(look: Look) -> Found[PodRule]:
    try:
        rules = pod_rules(dump_rules())
    except OSError as err:
        return Found((), errors=(SourceError("netlink", str(err)),))
    return Found(tuple(with_owners(rules, look.found(hostlocal.KIND), look.found(cache.KIND))))


def identity(rule: PodRule) -> Identity:
    r = rule.rule
    return (KIND_NAME, _FAMILY[r.family], str(r.priority), str(r.table), rule.direction, rule.ip)


def ref(rule: PodRule) -> ResourceRef:
    r = rule.rule
    bits = _FULL[r.family]
    name = (
        f"{r.priority}: to {rule.ip}/{bits} lookup main"
        if rule.direction == "to"
        else f"{r.priority}: from {rule.ip}/{bits} lookup {r.table}"
    )
    details: dict[str, DetailValue] = {
        "family": _FAMILY[r.family],
        "priority": r.priority,
        "table": r.table,
        "ip": rule.ip,
        "owner": rule.owner,
    }
    return ResourceRef(kind=KIND_NAME, name=name, created_at=None, details=details, identity=identity(rule))


def tie(rule: PodRule) -> Claim:
    return owner_claim(rule.container_id, rule.network)


def decide(
    rules: Sequence[PodRule], now: Sequence[RawRule], done: Mapping[Identity, Done]
) -> dict[Identity, Done | RawRule]:
    """Pure: for each rule, its Done, or the rule as dumped now to delete."""
    out: dict[Identity, Done | RawRule] = {}
    for rule in rules:
        same = [r for r in now if _selector(r) == _selector(rule.rule)]
        mine = [r for r in same if pod_rule(r) is not None]
        if not mine:
            out[identity(rule)] = Done.freed()  # no rule of that shape is there any more
        elif len(same) != len(mine):
            out[identity(rule)] = Done.left(
                "another rule of the same priority, table and selector is there; left alone"
            )
        elif (why := hostlocal.still_leased(rule.leases, done)) is not None:
            out[identity(rule)] = Done.left(why)
        else:
            out[identity(rule)] = mine[0]
    return out


def reclaim(rules: Sequence[PodRule], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Each rule still there with the same priority, table and selector (dumped again with the
    reader the look used), deleted by those; see `decide` for what is left."""
    if not rules:
        return {}
    try:
        now = dump_rules()
    except OSError as err:
        return {identity(rule): Done.left(f"cannot re-read the rules: {err}") for rule in rules}
    verdicts = decide(rules, now, ctx.done)
    done = {ident: verdict for ident, verdict in verdicts.items() if isinstance(verdict, Done)}
    to_delete = {ident: verdict for ident, verdict in verdicts.items() if not isinstance(verdict, Done)}
    if to_delete:
        try:
            errors = delete_rules(list(to_delete.values()))
        except OSError as err:
            errors = [str(err)] * len(to_delete)
        done.update({i: Done.freed() if e is None else Done.left(e) for i, e in zip(to_delete, errors, strict=True)})
    return done


def frees(rule: PodRule) -> tuple[str, ...]:
    return (rule.ip,)


KIND: Kind[PodRule] = Kind(
    name=KIND_NAME, find=find, identity=identity, ref=ref, tie=tie, reclaim=reclaim, frees=frees, with_addresses=True
)
