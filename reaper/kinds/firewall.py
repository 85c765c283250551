"""The firewall plugin's per-pod accept rules in the filter table's CNI-FORWARD chain.

The rules carry no container ID: the tie is a Claim on the one host-local lease holding the
address (else an empty Claim, never reclaimed). Which lines are records, and when one goes:
docs/design.md, "In depth: the kinds".
"""

from __future__ import annotations

import re
import socket
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

from msgspec import Struct
from msgspec.structs import replace

from reaper.cni.result import address_key
from reaper.kinds import Found, Kind, Look, ReclaimContext, cache, hostlocal, owner_claim
from reaper.kinds.cache import CacheEntry
from reaper.kinds.hostlocal import HostLocalLease
from reaper.kinds.iptables import Family, resaved, restore_each, save_lines, saved
from reaper.model import Claim, DetailValue, Done, Identity, ResourceRef

KIND_NAME = "firewall"
TABLE = "filter"
_BITS: dict[Family, str] = {"ipv4": "32", "ipv6": "128"}
_AF: dict[Family, socket.AddressFamily] = {"ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}
# The two rules, exactly: to the pod (replies only) and from it.
_RULE = re.compile(
    r"-A CNI-FORWARD (?:-d (?P<dst>[0-9a-f.:]{2,39})/(?P<dbits>32|128)"
    r" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    r"|-s (?P<src>[0-9a-f.:]{2,39})/(?P<sbits>32|128) -j ACCEPT)"
)


class ForwardRule(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One of the firewall plugin's accept rules for a pod address."""

    family: Family
    backend: str  # iptables "nft" or "legacy" (or "default" when only one exists)
    ip: str  # as iptables-save prints it, without the prefix length
    rule: str  # the whole line, `-A CNI-FORWARD ...`, as iptables-save prints it
    # The owner, by the one host-local lease holding its address: none when it has none.
    container_id: str | None = None
    network: str | None = None
    # Every lease holding its address when it was found, as the ipam kind identifies them.
    leases: tuple[Identity, ...] = ()
    owner: str = "not looked up"  # whose it is, or why it is no one's, in words

    @property
    def spec(self) -> str:
        """The rule without `-A `: what iptables-restore's `-D` takes."""
        return self.rule[3:]


def _canonical(text: str, family: Family) -> str | None:
    """`text` when it is an address of `family` in the form iptables-save prints (inet_ntop's)."""
    try:
        packed = socket.inet_pton(_AF[family], text)
    except (OSError, ValueError):
        return None
    return text if socket.inet_ntop(_AF[family], packed) == text else None


def _rule_lines(text: str, family: Family) -> Iterator[tuple[str, str]]:
    """(line, address) of every copy of the plugin's rules in the `*filter` table of an
    `iptables-save` output, each line starting outside every quoted string (save_lines)."""
    table = ""
    for line in save_lines(text):
        if line.startswith("*"):
            table = line[1:].strip()
            continue
        if table != TABLE or not line.startswith("-A CNI-FORWARD -"):
            continue
        match = _RULE.fullmatch(line)
        if match is None:
            continue
        address, bits = (match["dst"], match["dbits"]) if match["dst"] is not None else (match["src"], match["sbits"])
        if bits == _BITS[family] and _canonical(address, family) is not None:
            yield line, address


def parse_filter_save(text: str, family: Family, backend: str = "default") -> list[ForwardRule]:
    """The firewall plugin's rules in the output of `iptables-save -t filter`, each text once."""
    found: dict[str, ForwardRule] = {}
    for line, address in _rule_lines(text, family):
        found.setdefault(line, ForwardRule(family=family, backend=backend, ip=address, rule=line))
    return list(found.values())


def with_owners(
    rules: Iterable[ForwardRule], leases: Iterable[HostLocalLease], caches: Iterable[CacheEntry]
) -> list[ForwardRule]:
    """Each rule with the owner of its address: the container and network of the one host-local
    lease that holds it, unless a cache entry of another container names the address (off-node
    IPAM gave it to a pod). Held by no lease, or by more than one, it has no owner."""
    rules = list(rules)
    if not rules:  # the common case: no firewall plugin here, so no lease index is built
        return []
    held: dict[tuple[int, int], list[HostLocalLease]] = {}
    for lease in leases:
        key = hostlocal.ip_key(lease.ip)
        if key is not None:
            held.setdefault(key, []).append(lease)
    named: dict[tuple[int, int], set[str]] = {}
    for entry in caches:
        for ip in entry.ips:
            key = address_key(ip)  # in any form a file gives it, as the plugins read it
            if key is not None:
                named.setdefault(key, set()).add(entry.container_id)
    out = []
    for rule in rules:
        key = hostlocal.ip_key(rule.ip)
        holding = held.get(key, []) if key is not None else []
        if key is None or not holding:
            out.append(replace(rule, owner=f"no host-local lease holds {rule.ip}"))
            continue
        leases_of = tuple(hostlocal.identity(lease) for lease in holding)
        if len(holding) > 1:
            paths = ", ".join(sorted(lease.path for lease in holding))
            out.append(replace(rule, leases=leases_of, owner=f"{len(holding)} leases hold {rule.ip}: {paths}"))
            continue
        (lease,) = holding
        others = named.get(key, set()) - {lease.container_id}
        if others:
            who = ", ".join(sorted(cid[:12] for cid in others))
            owner = f"{rule.ip} is leased to {lease.container_id[:12]}, and a cache entry of {who} names it"
            out.append(replace(rule, leases=leases_of, owner=owner))
            continue
        owner = f"lease {lease.path}"
        out.append(replace(rule, container_id=lease.container_id, network=lease.network, leases=leases_of, owner=owner))
    return out


def find(look: Look) -> Found[ForwardRule]:
    rules, errors = saved(KIND_NAME, TABLE, parse_filter_save, look.options.command_timeout, look.memo.outputs)
    owned = with_owners(rules, look.found(hostlocal.KIND), look.found(cache.KIND))
    return Found(tuple(owned), errors=tuple(errors))


def identity(rule: ForwardRule) -> Identity:
    return ("firewall", rule.family, rule.backend, rule.rule)


def ref(rule: ForwardRule) -> ResourceRef:
    details: dict[str, DetailValue] = {
        "family": rule.family,
        "backend": rule.backend,
        "table": TABLE,
        "ip": rule.ip,
        "owner": rule.owner,
    }
    return ResourceRef(kind="firewall", name=rule.spec, created_at=None, details=details, identity=identity(rule))


def tie(rule: ForwardRule) -> Claim:
    return owner_claim(rule.container_id, rule.network)


def _still_held(rule: ForwardRule, done: Mapping[Identity, Done]) -> str | None:
    """Why the rule's address may be someone's now: it was shared, or hostlocal.still_leased; None: it may go."""
    if rule.container_id is None and rule.leases:
        return f"left: {rule.owner}"
    return hostlocal.still_leased(rule.leases, done)


def reclaim(rules: Sequence[ForwardRule], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Every copy of each rule a fresh save still shows with the same text, in one restore_each
    per family and backend. The chains and the jumps to them stay."""
    done: dict[Identity, Done] = {}
    for group, tool, text in resaved(rules, TABLE, ctx.command_timeout):
        if isinstance(tool, str):
            done.update({identity(r): Done.left(tool) for r in group})
            continue
        copies = Counter(line for line, _ in _rule_lines(text, tool.family))
        items: dict[Identity, list[str]] = {}
        for rule in group:
            if rule.rule not in copies:
                done[identity(rule)] = Done.freed()
                continue
            why = _still_held(rule, ctx.done)
            if why is not None:
                done[identity(rule)] = Done.left(why)
                continue
            items[identity(rule)] = [f"-D {rule.spec}"] * copies[rule.rule]
        if items:
            done.update(restore_each(tool, TABLE, list(items.items()), ctx.command_timeout))
    return done


def frees(rule: ForwardRule) -> tuple[str, ...]:
    return (rule.ip,)


KIND: Kind[ForwardRule] = Kind(
    name=KIND_NAME, find=find, identity=identity, ref=ref, tie=tie, reclaim=reclaim, frees=frees, with_addresses=True
)
