"""Rules the CNI plugins' nftables backend leaves: `inet cni_plugins_masquerade`, `cni_hostport`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

from reaper.model import NftRule, SourceError
from reaper.names import is_cni_id, is_ifname

CNI_TABLES = {("inet", "cni_plugins_masquerade"), ("ip", "cni_hostport"), ("ip6", "cni_hostport")}
_MASQ_COMMENT = re.compile(r"net: ([^,\s]+), if: ([^,\s]+), id: ([^,\s]+)")


class NftOutputError(ValueError):
    pass


def _items(text: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(text)
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
        if table == "cni_plugins_masquerade":
            match = _MASQ_COMMENT.search(comment)
            if not match:
                continue
            net, ifname, cid = match.groups()
            if is_cni_id(net) and is_ifname(ifname) and is_cni_id(cid):
                rules.append(NftRule(family, table, chain, handle, net, ifname, cid))
        elif table == "cni_hostport" and is_cni_id(comment.strip()):
            rules.append(NftRule(family, table, chain, handle, None, None, comment.strip()))
    return rules


def _run(argv: list[str], timeout: float) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise NftOutputError((proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1])
    return proc.stdout


_FAMILIES = {1: "inet", 2: "ip", 10: "ip6"}


def present_cni_tables() -> list[tuple[str, str]]:
    """The CNI tables that exist, asked over nfnetlink: `nft list tables` costs ~90 ms because
    it loads the whole ruleset, this costs ~2 ms, and the common answer is "none"."""
    from pyroute2.nftables.main import NFTables  # noqa: PLC0415 (only needed here)

    nft = NFTables(nfgen_family=0)
    try:
        found = {
            (_FAMILIES.get(int(t["nfgen_family"]), ""), str(t.get_attr("NFTA_TABLE_NAME"))) for t in nft.get_tables()
        }
    finally:
        nft.close()
    return sorted(found & CNI_TABLES)


def collect_nft_rules(timeout: float) -> tuple[list[NftRule], list[SourceError]]:
    try:
        tables = present_cni_tables()
    except OSError as err:
        # No nf_tables in this kernel: nothing of the nft backend can exist.
        return [], [] if err.errno in (2, 93, 97) else [SourceError("nfnetlink", str(err))]
    if not tables:
        return [], []
    nft = shutil.which("nft")
    if nft is None:
        return [], [SourceError("nft", f"not installed, but CNI nft tables exist: {tables}")]
    try:
        rules: list[NftRule] = []
        for family, name in tables:
            rules.extend(parse_rules(_run([nft, "-j", "list", "table", family, name], timeout)))
    except (OSError, subprocess.TimeoutExpired, NftOutputError) as err:
        return [], [SourceError("nft", str(err))]
    return rules, []
