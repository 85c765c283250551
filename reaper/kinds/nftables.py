"""Rules the CNI plugins' nftables backend leaves: `inet cni_plugins_masquerade`, `cni_hostport`.

Identity: (family, table, chain, handle). The owner is read from the rule's comment by
`parse_rules`, the one reader of `nft -j` output: the look uses it, and so does the compare
right before a rule is deleted by its handle.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import re
import shutil
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from msgspec import Struct

from reaper.host import netlink
from reaper.host.commands import run_command
from reaper.host.jsondoc import parse_json
from reaper.kinds import Found, Kind, Look, ReclaimContext, batch_or_each
from reaper.model import Claim, DetailValue, Done, Identity, ResourceRef, SourceError
from reaper.names import is_cni_id, is_ifname

# No nf_tables here at all: nothing of the nft backend can exist.
_NO_NFTABLES = (errno.ENOENT, errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT)

CNI_TABLES = {("inet", "cni_plugins_masquerade"), ("ip", "cni_hostport"), ("ip6", "cni_hostport")}
# The masquerade comment (containernetworking/plugins pkg/ip/ipmasq_nftables_linux.go): the
# instance hash, then a description, all cut at knftables' 128 characters.
_MASQ_COMMENT = re.compile(r"([0-9a-f]{16}-[0-9a-f]{16})(?:, net: ([^,]*)(?:, if: ([^,]*)(?:, id: (.*))?)?)?")
HASH_CHARS = 16
# What may go into `nft -f` script text as a family and a chain name: nothing that ends a
# statement or starts another (a crafted name once flushed the whole ruleset).
_FAMILIES_ALLOWED = frozenset({"inet", "ip", "ip6"})
_CHAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")


class NftRule(Struct, frozen=True, kw_only=True):
    """A rule of the CNI plugins' nftables backend and the key its comment carries: a masquerade
    rule's `instance` hash (its description is cut at 128 characters: for reading only), a
    hostport rule's whole container ID."""

    family: str
    table: str
    chain: str
    handle: int
    network: str | None  # as described
    ifname: str | None  # as described
    container_id: str | None  # as described: may be cut short in a masquerade rule
    instance: str | None = None  # the masquerade rule's instance hash


class NftOutputError(ValueError):
    pass


def _items(text: str) -> list[dict[str, Any]]:
    try:
        doc = parse_json(text)
    except ValueError as err:
        raise NftOutputError(f"invalid JSON from nft: {err}") from None
    items = doc.get("nftables") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise NftOutputError("nft output has no nftables list")
    return [i for i in items if isinstance(i, dict)]


def parse_rules(text: str) -> list[NftRule]:
    """Rules carrying an attachment's identity in their comment, from `nft -j list table`."""
    rules = []
    for item in _items(text):
        rule = item.get("rule")
        if not isinstance(rule, dict):
            continue
        comment, handle = rule.get("comment"), rule.get("handle")
        family, table, chain = rule.get("family"), rule.get("table"), rule.get("chain")
        if not (isinstance(comment, str) and isinstance(handle, int)):
            continue
        if not (isinstance(family, str) and isinstance(table, str) and isinstance(chain, str)):
            continue
        if family not in _FAMILIES_ALLOWED or _CHAIN_NAME.fullmatch(chain) is None or handle < 0:
            continue
        at = functools.partial(NftRule, family=family, table=table, chain=chain, handle=handle)
        if table == "cni_plugins_masquerade":
            match = _MASQ_COMMENT.fullmatch(comment)
            if not match:
                continue  # not a plugin's rule (an admin's, or an older format): never ours
            instance, net, ifname, cid = match.groups()
            network = net if net and is_cni_id(net) else None
            ifname = ifname if ifname and is_ifname(ifname) else None
            cid = cid if cid and is_cni_id(cid) else None
            rules.append(at(network=network, ifname=ifname, container_id=cid, instance=instance))
        elif table == "cni_hostport" and is_cni_id(comment.strip()):
            rules.append(at(network=None, ifname=None, container_id=comment.strip()))
    return rules


def _list_table(nft: str, family: str, table: str, timeout: float) -> str:
    result = run_command([nft, "-j", "list", "table", family, table], timeout)
    if result.code != 0:
        # nft prints "Error: ..." and then the command with a caret line under it.
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        raise NftOutputError(errors[0] if errors else result.last_error_line)
    return result.stdout


_FAMILIES = {1: "inet", 2: "ip", 10: "ip6"}
NETLINK_NETFILTER = 12
NFT_GET_TABLES = (10 << 8) | 1  # NFNL_SUBSYS_NFTABLES, NFT_MSG_GETTABLE
NFTA_TABLE_NAME = 1
_ANY_FAMILY = b"\0\0\0\0"  # nfgenmsg: family unspecified, version 0, resource id 0


def _table(data: bytes | bytearray, offset: int, length: int) -> tuple[str, str]:
    """(family, name) of one NFT_MSG_NEWTABLE answer: nfgenmsg after the header, then attributes."""
    attrs = netlink.attrs(data, offset + 20, offset + length, frozenset({NFTA_TABLE_NAME}))
    name = netlink.cstring(data, attrs[NFTA_TABLE_NAME]) if NFTA_TABLE_NAME in attrs else ""
    return _FAMILIES.get(data[offset + 16], ""), name


def present_cni_tables() -> list[tuple[str, str]]:
    """The CNI tables that exist, asked over nfnetlink rather than with `nft list tables`, which
    loads the whole ruleset to answer; the common answer is "none"."""
    with netlink.Netlink(NETLINK_NETFILTER) as nl:
        found = set(nl.dump(NFT_GET_TABLES, _ANY_FAMILY, _table))
    return sorted(found & CNI_TABLES)


def collect_nft_rules(timeout: float) -> tuple[list[NftRule], list[SourceError]]:
    try:
        tables = present_cni_tables()
    except OSError as err:
        return [], [] if err.errno in _NO_NFTABLES else [SourceError("nfnetlink", str(err))]
    if not tables:
        return [], []
    nft = shutil.which("nft")
    if nft is None:
        return [], [SourceError("nft", f"not installed, but CNI nft tables exist: {tables}")]
    try:
        return [rule for family, name in tables for rule in parse_rules(_list_table(nft, family, name, timeout))], []
    except NftOutputError as err:
        return [], [SourceError("nft", str(err))]


def instance_hash(network: str, ifname: str, container_id: str) -> str:
    """The masquerade rule's key for an attachment, as the plugins compute it."""
    network_hash = hashlib.sha512(network.encode()).hexdigest()[:HASH_CHARS]
    return network_hash + "-" + hashlib.sha512(f"{ifname}:{container_id}".encode()).hexdigest()[:HASH_CHARS]


def find(look: Look) -> Found[NftRule]:
    rules, errors = collect_nft_rules(look.options.command_timeout)
    return Found(tuple(rules), errors=tuple(errors))


def identity(rule: NftRule) -> Identity:
    return ("nft", rule.family, rule.table, rule.chain, str(rule.handle))


def ref(rule: NftRule) -> ResourceRef:
    described: dict[str, DetailValue] = {"container_id": rule.container_id}
    if rule.instance is not None:
        described = {"instance": rule.instance, "network": rule.network, "ifname": rule.ifname, **described}
    name = f"{rule.family} {rule.table} {rule.chain} {rule.handle}"
    return ResourceRef(kind="nft", name=name, created_at=None, details=described, identity=identity(rule))


def tie(rule: NftRule) -> Claim | None:
    if rule.instance is not None:
        return Claim(key=rule.instance)
    return Claim(container_id=rule.container_id) if rule.container_id is not None else None


def reclaim(rules: Sequence[NftRule], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Delete rules by handle, each only while the rule at that handle still is the one found
    (the same reader's reading of it, owner included)."""
    nft = shutil.which("nft")
    if nft is None:
        return {identity(r): Done.left("nft not installed") for r in rules}
    done: dict[Identity, Done] = {}
    by_table: dict[tuple[str, str], list[NftRule]] = defaultdict(list)
    for rule in rules:
        by_table[(rule.family, rule.table)].append(rule)
    for (family, table), group in by_table.items():
        try:
            now = {identity(r): r for r in parse_rules(_list_table(nft, family, table, ctx.command_timeout))}
        except NftOutputError as err:
            # The table is gone, and the rules with it.
            gone = "No such file" in str(err)
            done.update({identity(r): Done.freed() if gone else Done.left(str(err)[:200]) for r in group})
            continue
        batch: dict[Identity, str] = {}
        for rule in group:
            current = now.get(identity(rule))
            if current is None:
                done[identity(rule)] = Done.freed()
            elif current != rule:
                done[identity(rule)] = Done.left("handle now carries another rule; left alone")
            else:
                batch[identity(rule)] = f"delete rule {family} {table} {rule.chain} handle {rule.handle}"
        if batch:
            done.update(batch_or_each(batch, functools.partial(_run_script, nft, ctx.command_timeout)))
    return done


def _run_script(nft: str, timeout: float, lines: Sequence[str]) -> str | None:
    result = run_command([nft, "-f", "-"], timeout, "\n".join(lines) + "\n")
    return None if result.code == 0 else result.stderr.strip()[:200]


# with_addresses: a masquerade rule matches its pod's address (`ip saddr`), as the iptables
# backend's chain does; a hostport rule DNATs to it.
KIND: Kind[NftRule] = Kind(
    name="nft",
    find=find,
    identity=identity,
    ref=ref,
    tie=tie,
    reclaim=reclaim,
    key_of=lambda container_id, network, ifname: instance_hash(network, ifname, container_id),
    with_addresses=True,
)
