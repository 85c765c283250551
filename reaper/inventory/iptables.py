"""The nat chains CNI plugins leave in iptables: bridge ipMasq and portmap hostPort chains."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from reaper.model import IptablesChain, SourceError
from reaper.names import is_cni_id

Family = Literal["ipv4", "ipv6"]
SAVE_COMMANDS: dict[Family, str] = {"ipv4": "iptables-save", "ipv6": "ip6tables-save"}
_CHAIN_PATTERNS: tuple[tuple[re.Pattern[str], str, Literal["masquerade", "hostport-dnat", "hostport-snat"]], ...] = (
    (re.compile(r"CNI-[0-9a-f]{24}"), "", "masquerade"),
    (re.compile(r"CNI-DN-[0-9a-f]{21}"), "DN-", "hostport-dnat"),
    (re.compile(r"CNI-SN-[0-9a-f]{21}"), "SN-", "hostport-snat"),
)
_TARGET = re.compile(r" -[jg] (\S+)")
_COMMENT = re.compile(r'--comment (?:"((?:[^"\\]|\\.)*)"|(\S+))')
_OWNER = re.compile(r'name:? "([^"]*)" id: "([^"]*)"')


def chain_name(prefix: str, network: str, container_id: str) -> str:
    """The name the plugins give a per-attachment chain (`CNI-` + prefix + sha512 hex, 28 chars)."""
    digest = hashlib.sha512((network + container_id).encode()).hexdigest()
    return ("CNI-" + prefix + digest)[:28]


@dataclass(frozen=True)
class _Rule:
    chain: str
    target: str | None
    owner: tuple[str, str] | None
    text: str


def _parse_rule(line: str) -> _Rule:
    chain = line.split(" ", 2)[1]
    target_match = _TARGET.search(line)
    owner = None
    comment_match = _COMMENT.search(line)
    if comment_match:
        comment = (comment_match.group(1) or comment_match.group(2) or "").replace('\\"', '"')
        owner_match = _OWNER.search(comment)
        if owner_match and is_cni_id(owner_match.group(1)) and is_cni_id(owner_match.group(2)):
            owner = (owner_match.group(1), owner_match.group(2))
    return _Rule(chain, target_match.group(1) if target_match else None, owner, line)


def parse_save(text: str, family: Family) -> list[IptablesChain]:
    """Per-attachment chains in the output of `iptables-save -t nat`."""
    chains: list[str] = []
    rules_of: dict[str, list[_Rule]] = {}
    jumps_to: dict[str, list[_Rule]] = {}
    table = "nat"
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":"):
            name = line[1:].split(" ", 1)[0]
            chains.append(name)
        elif line.startswith("-A "):
            try:
                rule = _parse_rule(line)
            except IndexError:
                continue
            rules_of.setdefault(rule.chain, []).append(rule)
            if rule.target is not None and rule.target.startswith("CNI-"):
                jumps_to.setdefault(rule.target, []).append(rule)
    found: list[IptablesChain] = []
    for name in chains:
        for pattern, prefix, purpose in _CHAIN_PATTERNS:
            if not pattern.fullmatch(name):
                continue
            own = rules_of.get(name, [])
            jumps = jumps_to.get(name, [])
            owner = _owner(name, prefix, own + jumps)
            found.append(
                IptablesChain(
                    family=family,
                    table=table,
                    chain=name,
                    purpose=purpose,
                    network=owner[0] if owner else None,
                    container_id=owner[1] if owner else None,
                    rules=tuple(r.text for r in own),
                    jumps=tuple(r.text for r in jumps),
                )
            )
            break
    return found


def _owner(name: str, prefix: str, rules: list[_Rule]) -> tuple[str, str] | None:
    """The (network, container ID) in the rules' comments, confirmed by the chain's hash."""
    for rule in rules:
        if rule.owner is not None and chain_name(prefix, *rule.owner) == name:
            return rule.owner
    return None


def collect_chains(timeout: float) -> tuple[list[IptablesChain], list[SourceError]]:
    chains: list[IptablesChain] = []
    errors: list[SourceError] = []
    for family, command in SAVE_COMMANDS.items():
        binary = shutil.which(command)
        if binary is None:
            if family == "ipv4":
                errors.append(SourceError(command, "not installed"))
            continue
        try:
            proc = subprocess.run([binary, "-t", "nat"], capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            errors.append(SourceError(command, str(err)))
            continue
        if proc.returncode != 0:
            msg = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            # A kernel without the nat table for this family has nothing of ours in it.
            if "does not exist" in msg or "Table does not exist" in msg:
                continue
            errors.append(SourceError(command, msg))
            continue
        chains.extend(parse_save(proc.stdout, family))
    return chains, errors
