"""The nat chains CNI plugins leave in iptables: bridge ipMasq and portmap hostPort chains.

Identity: (family, backend, chain name). The key is in the name (`CNI-` + a sha512 prefix of
network + container ID), recomputed from the owner its comments name before a chain is tied.
Also the `iptables-save` reading the firewall kind shares. A chain and the jumps to it go in one
`iptables-restore --noflush` per table, after a fresh save shows them still there.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from subprocess import PIPE
from typing import Literal, NamedTuple, Protocol, TypeVar

from msgspec import Struct

from reaper.host.commands import run_command
from reaper.host.memo import OutputMemo
from reaper.kinds import Found, Kind, Look, ReclaimContext, batch_or_each
from reaper.model import Claim, DetailValue, Done, Identity, ResourceRef, SourceError
from reaper.names import is_cni_id

KIND_NAME = "iptables"
RESTORE_LOCK_WAIT = "5"  # seconds iptables-restore waits for the xtables lock (its -w)

Family = Literal["ipv4", "ipv6"]
_PREFIX: dict[Family, str] = {"ipv4": "iptables", "ipv6": "ip6tables"}
_LEGACY_TABLES: dict[Family, str] = {"ipv4": "/proc/net/ip_tables_names", "ipv6": "/proc/net/ip6_tables_names"}


class IptablesChain(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """A per-attachment nat chain a CNI plugin made, and the rules that jump to it."""

    family: Family
    table: str
    chain: str
    purpose: Purpose
    network: str | None
    container_id: str | None
    rules: tuple[str, ...]  # its own rules, as iptables-save prints them
    jumps: tuple[str, ...]  # rules in other chains that jump to it
    backend: str = "default"  # iptables "nft" or "legacy" (or "default" when only one exists)


class IptablesTools(Struct, frozen=True):
    family: Family
    backend: str  # "nft", "legacy", or "default" (whatever iptables-save is here)
    save: str
    restore: str


def _legacy_table_loaded(family: Family, table: str) -> bool:
    """The legacy `table` exists here: asking iptables-legacy-save otherwise would load it
    (iptable_nat, iptable_filter) on a node that never used it."""
    try:
        with open(_LEGACY_TABLES[family], encoding="ascii", errors="replace") as f:
            return table in f.read().split()
    except OSError:
        return False


def iptables_tools(table: str = "nat") -> list[IptablesTools]:
    """Every backend that can hold CNI rules in `table` here: nft when installed, legacy when its
    `table` is in use (plugins and kube-proxy may disagree, so a node can have rules in both)."""
    tools = []
    for family, prefix in _PREFIX.items():
        found = []
        for backend in ("nft", "legacy"):
            save, restore = shutil.which(f"{prefix}-{backend}-save"), shutil.which(f"{prefix}-{backend}-restore")
            if save and restore and (backend == "nft" or _legacy_table_loaded(family, table)):
                found.append(IptablesTools(family, backend, save, restore))
        if not found and not (shutil.which(f"{prefix}-nft-save") or shutil.which(f"{prefix}-legacy-save")):
            save, restore = shutil.which(f"{prefix}-save"), shutil.which(f"{prefix}-restore")
            if save and restore:
                found.append(IptablesTools(family, "default", save, restore))
        tools += found
    return tools


Purpose = Literal["masquerade", "hostport-dnat", "hostport-snat"]
_CHAIN_PATTERNS: tuple[tuple[re.Pattern[str], str, Purpose], ...] = (
    (re.compile(r"CNI-[0-9a-f]{24}"), "", "masquerade"),
    (re.compile(r"CNI-DN-[0-9a-f]{21}"), "DN-", "hostport-dnat"),
    (re.compile(r"CNI-SN-[0-9a-f]{21}"), "SN-", "hostport-snat"),
)
# The inside of a quoted string: iptables-save escapes `"`, `\` and `'` with a backslash and prints
# every other byte as it is, newlines included. Runs of plain characters between escapes match
# what `(?:[^"\\]|\\.)*` does, with no alternation tried at each character.
_QUOTED = r'[^"\\]*(?:\\.[^"\\]*)*'
_COMMENT = re.compile(rf'--comment (?:"({_QUOTED})"|(\S+))')
_OWNER = re.compile(r'name:? "([^"]*)" id: "([^"]*)"')


def chain_name(prefix: str, network: str, container_id: str) -> str:
    """The name the plugins give a per-attachment chain (`CNI-` + prefix + sha512 hex, 28 chars)."""
    digest = hashlib.sha512((network + container_id).encode()).hexdigest()
    return ("CNI-" + prefix + digest)[:28]


_TOKEN = re.compile(rf'"{_QUOTED}"|\S+')  # a rule's words, a quoted string one word


def _target(line: str) -> str | None:
    """The chain a rule jumps or goes to, read from its words: a `-j CNI-...` inside a quoted
    string (an NFLOG prefix, a comment) is text, not a jump."""
    tokens: list[str] = _TOKEN.findall(line)
    return next((tokens[i + 1] for i, token in enumerate(tokens[:-1]) if token in ("-j", "-g")), None)


def _owner_in(line: str) -> tuple[str, str] | None:
    comment = _COMMENT.search(line)
    owner = _OWNER.search((comment.group(1) or comment.group(2) or "").replace('\\"', '"')) if comment else None
    if owner and is_cni_id(owner.group(1)) and is_cni_id(owner.group(2)):
        return owner.group(1), owner.group(2)
    return None


_QUOTED_REST = re.compile(_QUOTED + '"')  # the rest of a quoted string, to its closing quote


def _ends_quoted(line: str, quoted: bool) -> bool:
    """Whether a quoted string is still open at the end of `line`, given whether one was at its
    start. Outside quotes a backslash is a plain character."""
    if not quoted and "\\" not in line:
        return line.count('"') % 2 == 1  # no escapes: every other quote closes one
    at = 0
    while True:
        if quoted:
            rest = _QUOTED_REST.match(line, at)
            if rest is None:
                return True
            at, quoted = rest.end(), False
        else:
            at = line.find('"', at) + 1
            if at == 0:
                return False
            quoted = True


def save_lines(text: str) -> Iterator[str]:
    """The lines of `iptables-save` output that start outside every quoted string: a comment
    may hold a newline and anything after it, which is text, never a line of its own."""
    quoted = False
    for line in text.split("\n"):
        starts_quoted = quoted
        if quoted or '"' in line:
            quoted = _ends_quoted(line, quoted)
        if not starts_quoted:
            yield line


def parse_save(text: str, family: Family, backend: str = "default") -> list[IptablesChain]:
    """Per-attachment chains in the output of `iptables-save -t nat`. Only lines that touch a
    `CNI-` chain are looked at closely: a nat table can hold tens of thousands of kube-proxy rules."""
    chains: list[str] = []
    rules_of: dict[str, list[str]] = {}
    jumps_to: dict[str, list[str]] = {}
    table = "nat"
    for line in save_lines(text):
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
            own, jumps = rules_of.get(name, []), jumps_to.get(name, [])
            network, container_id = _owner(name, prefix, own + jumps) or (None, None)
            found.append(
                IptablesChain(
                    family=family,
                    table=table,
                    chain=name,
                    purpose=purpose,
                    network=network,
                    container_id=container_id,
                    rules=tuple(own),
                    jumps=tuple(jumps),
                    backend=backend,
                )
            )
            break
    return found


def _owner(name: str, prefix: str, lines: list[str]) -> tuple[str, str] | None:
    """The (network, container ID) in the rules' comments, confirmed by the chain's hash."""
    return next((o for line in lines if (o := _owner_in(line)) is not None and chain_name(prefix, *o) == name), None)


class OnBackend(Protocol):
    """A record read from one family and backend's `iptables-save`."""

    @property
    def family(self) -> str: ...

    @property
    def backend(self) -> str: ...


B = TypeVar("B", bound=OnBackend)


# The tables a look reads: the firewall kind's (filter) and this kind's (nat).
LOOK_TABLES = ("filter", "nat")
_ROUND = "iptables-save"  # the name of a look's SaveRound in the OutputMemo


class Saves(NamedTuple):
    """One table's `iptables-save` outputs, each with the tools that printed it, and what failed."""

    outputs: list[tuple[IptablesTools, str]]
    errors: list[SourceError]


def run_saves(tables: Sequence[str], timeout: float) -> dict[str, Saves]:
    """`iptables-save -t TABLE` of every family and backend for each of `tables`, all run side
    by side, each output read whole."""
    by_table: dict[str, Saves] = {}
    running: list[tuple[str, IptablesTools, subprocess.Popen[str]]] = []
    try:
        for table in tables:
            saves = by_table[table] = Saves([], [])
            tools = iptables_tools(table)
            if not any(t.family == "ipv4" for t in tools):
                saves.errors.append(SourceError("iptables-save", "not installed"))
            for tool in tools:
                try:
                    proc = subprocess.Popen(
                        [tool.save, "-t", table], stdout=PIPE, stderr=PIPE, text=True, errors="replace"
                    )
                except OSError as err:
                    saves.errors.append(SourceError(tool.save, str(err)))
                    continue
                running.append((table, tool, proc))
        for table, tool, proc in running:
            saves, command = by_table[table], os.path.basename(tool.save)
            try:
                out, said = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                saves.errors.append(SourceError(command, f"timed out after {timeout:.0f}s"))
                continue
            if proc.returncode != 0:
                msg = (said.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                # A kernel without the table for this family has nothing of ours in it.
                if "does not exist" not in msg:
                    saves.errors.append(SourceError(command, msg))
                continue
            saves.outputs.append((tool, out))
    finally:
        for _, _, proc in running:  # what timed out, or is left after an error
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return by_table


class SaveRound:
    """A look's saves of every table in LOOK_TABLES, run side by side by the first kind that
    reads one; each table's outputs are handed out once (a second find of the same table in
    one pass saves that table again, as it is then)."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._left: dict[str, Saves] | None = None

    def take(self, table: str) -> Saves:
        if self._left is None:
            self._left = run_saves(LOOK_TABLES if table in LOOK_TABLES else (table,), self._timeout)
        taken = self._left.pop(table, None)
        return taken if taken is not None else run_saves((table,), self._timeout)[table]


def saved(
    kind: str,
    table: str,
    parse: Callable[[str, Family, str], Sequence[B]],
    timeout: float,
    memo: OutputMemo | None,
) -> tuple[list[B], list[SourceError]]:
    """`iptables-save -t TABLE` of every family and backend, each output parsed. With a memo, a
    look's tables are saved side by side once a pass (SaveRound), and an output the same as last
    pass's but for its time stamps is not parsed again (an exact comparison of what the parse
    reads). Reclaiming never acts on these records: it saves afresh before any delete."""
    if memo is None:
        saves = run_saves((table,), timeout)[table]
        return [r for tool, out in saves.outputs for r in parse(out, tool.family, tool.backend)], list(saves.errors)
    saves = memo.once_a_pass(_ROUND, functools.partial(SaveRound, timeout)).take(table)
    records = [
        record
        for tool, out in saves.outputs
        for record in memo.parsed(
            f"{kind}:{tool.save} -t {table}",
            without_stamps(out),
            functools.partial(parse, out, tool.family, tool.backend),
        )
    ]
    return records, list(saves.errors)


# A line iptables-save writes itself, before and after each table, with the time in it.
_STAMP_LINE = re.compile(r'# (?:Generated by|Completed on) [^"\\\n]*(?:\n|$)')


def without_stamps(text: str) -> str:
    """`iptables-save` output less its "# Generated by"/"# Completed on" time stamp lines, so two
    runs over the same rules give the same text. Only such lines without a quote or backslash go:
    one inside a quoted comment then changes neither which lines start outside quotes nor any line
    parse_save reads, so two outputs the same without them parse the same."""
    kept: list[str] = []
    keep = at = 0
    while (at := text.find("# ", at)) >= 0:
        if at == 0 or text[at - 1] == "\n":
            stamp_line = _STAMP_LINE.match(text, at)
            if stamp_line is not None:
                kept.append(text[keep:at])
                keep = at = stamp_line.end()
                continue
        at += 2
    kept.append(text[keep:])
    return "".join(kept)


def find(look: Look) -> Found[IptablesChain]:
    chains, errors = saved(KIND_NAME, "nat", parse_save, look.options.command_timeout, look.memo.outputs)
    return Found(tuple(chains), errors=tuple(errors))


def identity(chain: IptablesChain) -> Identity:
    return ("iptables", chain.family, chain.backend, chain.chain)


def ref(chain: IptablesChain) -> ResourceRef:
    details: dict[str, DetailValue] = {
        "family": chain.family,
        "table": chain.table,
        "purpose": chain.purpose,
        "backend": chain.backend,
    }
    return ResourceRef(kind="iptables", name=chain.chain, created_at=None, details=details, identity=identity(chain))


def tie(chain: IptablesChain) -> Claim | None:
    """None: no owner its hash confirms; a Claim whose owner has no attachment is unconfirmed."""
    return Claim(chain.container_id, chain.network) if chain.container_id is not None else None


def resaved(records: Sequence[B], table: str, timeout: float) -> Iterator[tuple[list[B], IptablesTools | str, str]]:
    """The records by family and backend, each group with its tools and a fresh
    `iptables-save -t TABLE` of that backend, or why there is none (then the text is "")."""
    tools: dict[tuple[str, str], IptablesTools] = {(t.family, t.backend): t for t in iptables_tools(table)}
    groups: dict[tuple[str, str], list[B]] = defaultdict(list)
    for record in records:
        groups[(record.family, record.backend)].append(record)
    for (family, backend), group in groups.items():
        tool = tools.get((family, backend))
        if tool is None:
            yield group, f"no {backend} iptables tools here", ""
            continue
        saved = run_command([tool.save, "-t", table], timeout)
        if saved.code != 0:
            yield group, f"iptables-save: {saved.stderr.strip()[:200]}", ""
            continue
        yield group, tool, saved.stdout


def restore_each(
    tool: IptablesTools, table: str, items: Sequence[tuple[Identity, Sequence[str]]], timeout: float
) -> dict[Identity, Done]:
    """Every item's lines in one `iptables-restore --noflush` of `table`, as batch_or_each runs them."""

    def restore(lines: Sequence[str]) -> str | None:
        text = "\n".join([f"*{table}", *lines, "COMMIT"]) + "\n"
        result = run_command([tool.restore, "-w", RESTORE_LOCK_WAIT, "--noflush"], timeout, text)
        return None if result.code == 0 else result.last_error_line[:300]

    return batch_or_each(
        {ident: lines for ident, lines in items}, lambda each: restore([line for lines in each for line in lines])
    )


def _delete_lines(chain: IptablesChain) -> list[str]:
    return ["-D " + jump[3:] for jump in chain.jumps] + [f"-F {chain.chain}", f"-X {chain.chain}"]


def reclaim(chains: Sequence[IptablesChain], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Each chain and the rules that jump to it, as a fresh save shows them now, in one
    restore_each per family, backend and table."""
    done: dict[Identity, Done] = {}
    for group, tool, text in resaved(chains, "nat", ctx.command_timeout):
        if isinstance(tool, str):
            done.update({identity(c): Done.left(tool) for c in group})
            continue
        fresh = {c.chain: c for c in parse_save(text, tool.family, tool.backend)}
        by_table: dict[str, list[IptablesChain]] = defaultdict(list)
        for chain in group:
            if chain.chain in fresh:
                by_table[chain.table].append(fresh[chain.chain])
            else:
                done[identity(chain)] = Done.freed()
        for table, present in by_table.items():
            items = [(identity(c), _delete_lines(c)) for c in present]
            done.update(restore_each(tool, table, items, ctx.command_timeout))
    return done


def frees(chain: IptablesChain) -> list[str]:
    """A masquerade chain's pod address: the `-s` address of each rule jumping to it, as the
    bridge or ptp plugin wrote it into the kernel. Other chains free no address."""
    if chain.purpose != "masquerade":
        return []
    jumps = [rule.split() for rule in chain.jumps]
    return [w[i + 1] for w in jumps for i, word in enumerate(w[:-1]) if word == "-s" and (i == 0 or w[i - 1] != "!")]


KIND: Kind[IptablesChain] = Kind(
    name=KIND_NAME, find=find, identity=identity, ref=ref, tie=tie, reclaim=reclaim, frees=frees, with_addresses=True
)
