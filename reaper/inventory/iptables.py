"""The nat chains CNI plugins leave in iptables: bridge ipMasq and portmap hostPort chains."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
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
_COMMENT = re.compile(r'--comment (?:"((?:[^"\\]|\\.)*)"|(\S+))')
_OWNER = re.compile(r'name:? "([^"]*)" id: "([^"]*)"')


def chain_name(prefix: str, network: str, container_id: str) -> str:
    """The name the plugins give a per-attachment chain (`CNI-` + prefix + sha512 hex, 28 chars)."""
    digest = hashlib.sha512((network + container_id).encode()).hexdigest()
    return ("CNI-" + prefix + digest)[:28]


def _target(line: str) -> str | None:
    for flag in (" -j ", " -g "):
        at = line.rfind(flag)
        if at >= 0:
            return line[at + 4 :].split(" ", 1)[0]
    return None


def _owner_in(line: str) -> tuple[str, str] | None:
    comment_match = _COMMENT.search(line)
    if not comment_match:
        return None
    comment = (comment_match.group(1) or comment_match.group(2) or "").replace('\\"', '"')
    owner_match = _OWNER.search(comment)
    if owner_match and is_cni_id(owner_match.group(1)) and is_cni_id(owner_match.group(2)):
        return owner_match.group(1), owner_match.group(2)
    return None


def parse_save(text: str, family: Family) -> list[IptablesChain]:
    """Per-attachment chains in the output of `iptables-save -t nat`.

    Only lines that touch a `CNI-` chain are looked at closely: a node's nat table can hold
    tens of thousands of kube-proxy rules.
    """
    chains: list[str] = []
    rules_of: dict[str, list[str]] = {}
    jumps_to: dict[str, list[str]] = {}
    table = "nat"
    for line in text.splitlines():
        if line.startswith("-A "):
            end = line.find(" ", 3)
            chain = line[3:end] if end > 0 else line[3:]
            if chain.startswith("CNI-"):
                rules_of.setdefault(chain, []).append(line)
            if "-j CNI-" in line or "-g CNI-" in line:
                target = _target(line)
                if target is not None and target.startswith("CNI-"):
                    jumps_to.setdefault(target, []).append(line)
        elif line.startswith(":CNI-"):
            chains.append(line[1:].split(" ", 1)[0])
        elif line.startswith("*"):
            table = line[1:].strip()
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
                    rules=tuple(own),
                    jumps=tuple(jumps),
                )
            )
            break
    return found


def _owner(name: str, prefix: str, lines: list[str]) -> tuple[str, str] | None:
    """The (network, container ID) in the rules' comments, confirmed by the chain's hash."""
    for line in lines:
        owner = _owner_in(line)
        if owner is not None and chain_name(prefix, *owner) == name:
            return owner
    return None


class ChainCollector:
    """Runs `iptables-save -t nat` per family in the background; `result()` waits and parses.

    Started first in a snapshot, so the commands run while Python reads files.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.errors: list[SourceError] = []
        self.running: list[tuple[Family, str, subprocess.Popen[str]]] = []
        for family, command in SAVE_COMMANDS.items():
            binary = shutil.which(command)
            if binary is None:
                if family == "ipv4":
                    self.errors.append(SourceError(command, "not installed"))
                continue
            try:
                proc = subprocess.Popen(
                    [binary, "-t", "nat"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            except OSError as err:
                self.errors.append(SourceError(command, str(err)))
                continue
            self.running.append((family, command, proc))

    def result(self) -> tuple[list[IptablesChain], list[SourceError]]:
        chains: list[IptablesChain] = []
        errors = list(self.errors)
        for family, command, proc in self.running:
            try:
                out, err = proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                errors.append(SourceError(command, f"timed out after {self.timeout:.0f}s"))
                continue
            if proc.returncode != 0:
                msg = (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                # A kernel without the nat table for this family has nothing of ours in it.
                if "does not exist" not in msg:
                    errors.append(SourceError(command, msg))
                continue
            chains.extend(parse_save(out, family))
        self.running = []
        return chains, errors

    def close(self) -> None:
        """Stop whatever is still running (after an error elsewhere in the snapshot)."""
        for _, _, proc in self.running:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
