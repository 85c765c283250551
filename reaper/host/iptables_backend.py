"""Which iptables backend the node uses, and a PATH on which plugin DELs run that backend.

Plugins delete their rules with the first `iptables` on their PATH; the image's is nft, so on a
legacy node their DEL would delete nothing and succeed. The backend is read as kube-proxy's
iptables-wrapper reads it (kubelet's chains, then rule counts; undecided keeps PATH), legacy
only where the kernel already has the table. A differing choice is given through a private dir
of links to the system dirs' tools, first on PATH, gone when the pass ends. Why and sources:
docs/design.md, "The iptables backend plugins run".
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal

from msgspec import Struct

from reaper.host.commands import run_command
from reaper.host.files import describe_oserror
from reaper.host.resolve import Resolved, resolve_in_root

Backend = Literal["nft", "legacy"]
BACKENDS: tuple[Backend, ...] = ("nft", "legacy")
TOOLS = ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore")
SYSTEM_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")  # a plugin's link goes nowhere else
SAVE_TIMEOUT = 30.0  # seconds for one iptables-save
# The chains kubelet (1.17 and later) makes in mangle, in the backend it uses.
KUBELET_CHAINS = re.compile(r"^:(?:KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)\s", re.MULTILINE)
LEGACY_TABLES = {"iptables": "/proc/net/ip_tables_names", "ip6tables": "/proc/net/ip6_tables_names"}
_PRIVATE_PREFIX = "cni-reaper-iptables-"


class ToolRefused(Exception):
    """A backend's tool is missing from the system dirs, or not root's alone; one line."""


class SystemTool(Struct, frozen=True, kw_only=True):
    found: str  # its path in a system dir, whose name picks what a multi-call binary does
    real: str  # the file that path leads to


class BackendRules(Struct, frozen=True, kw_only=True):
    """What one backend holds in this netns, both families: mangle alone while kubelet's chains
    are looked for (rules 0), every table once rules are counted."""

    backend: Backend
    hinted: bool  # a kubelet chain is in it
    rules: int  # rule lines (`-A ...`) its saves printed
    unread: str | None = None  # why a save could not be read: the count is not all of it


class BackendChoice(Struct, frozen=True, kw_only=True):
    backend: Backend | None  # None: nothing decides; plugins keep their PATH
    reason: str


def choose_backend(nft: BackendRules, legacy: BackendRules) -> BackendChoice:
    """The backend the node uses, by iptables-wrapper's rule: a kubelet chain (nft's first), then
    more rules; nothing on a tie or an incomplete count."""
    for rules in (nft, legacy):
        if rules.hinted:
            return BackendChoice(backend=rules.backend, reason=f"kubelet's chain is in {rules.backend}")
    unread = [r.unread for r in (nft, legacy) if r.unread is not None]
    if unread:
        return BackendChoice(backend=None, reason=f"no kubelet chain, and {unread[0]}")
    counts = f"{legacy.rules} rules in legacy, {nft.rules} in nft"
    if legacy.rules != nft.rules:
        winner = legacy if legacy.rules > nft.rules else nft
        return BackendChoice(backend=winner.backend, reason=f"no kubelet chain; {counts}")
    if not legacy.rules:
        return BackendChoice(backend=None, reason="no kubelet chain and no rules in either backend")
    return BackendChoice(backend=None, reason=f"no kubelet chain and as many rules in each ({counts})")


def backend_tool(tool: str, backend: Backend) -> str:
    """The name of `tool`'s `backend` variant: iptables-save -> iptables-legacy-save."""
    family, _, verb = tool.partition("-")
    return f"{family}-{backend}-{verb}" if verb else f"{family}-{backend}"


def trusted_tool(name: str, *, dirs: Sequence[str] = SYSTEM_DIRS) -> SystemTool:
    """`name` in the first of `dirs` that has it, every directory and link on the way root's
    alone (reaper.host.resolve), an executable only root may write; else ToolRefused (the next
    dir is not tried)."""
    root_fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for directory in dirs:
            found = os.path.join(directory, name)
            try:
                resolved = resolve_in_root(root_fd, found, checked=True)
            except OSError as err:
                raise ToolRefused(f"{found}: {err.strerror}") from None
            if resolved is None:
                continue
            if not isinstance(resolved, Resolved):
                raise ToolRefused(f"{found}: {resolved.reason}")
            try:
                real = os.path.realpath(found)
                again = os.stat(real)
            finally:
                os.close(resolved.fd)
            # Owned by root (or this process's uid, as reaper.host.resolve trusts it), writable by no one else.
            mode, owner = resolved.mode, resolved.uid
            if not stat.S_ISREG(mode) or not mode & 0o111 or mode & 0o022 or owner not in (0, os.geteuid()):
                raise ToolRefused(f"{found} is not an executable file that only root may write")
            if (again.st_dev, again.st_ino) != resolved.key:
                raise ToolRefused(f"{found} changed while it was checked")
            return SystemTool(found=found, real=real)
    finally:
        os.close(root_fd)
    raise ToolRefused(f"{name} is in none of {':'.join(dirs)}")


def _legacy_tables(names_file: str) -> set[str]:
    try:
        with open(names_file, encoding="ascii", errors="replace") as f:
            return set(f.read().split())
    except OSError:
        return set()


def read_rules(
    backend: Backend,
    tools: Mapping[str, SystemTool],
    *,
    count: bool,
    timeout: float = SAVE_TIMEOUT,
    legacy_tables: Mapping[str, str] = LEGACY_TABLES,
) -> BackendRules:
    """What `backend` holds here, read with its own saves: only mangle (rules 0) unless `count`.
    Legacy only where `legacy_tables` lists the table (counting: any): a save never creates one."""
    hinted, rules, unread = False, 0, None
    for family in ("iptables", "ip6tables"):
        if backend == "legacy":
            names = _legacy_tables(legacy_tables[family])
            if not names or not (count or "mangle" in names):
                continue
        save = tools[f"{family}-save"].found
        out = run_command([save] if count else [save, "-t", "mangle"], timeout)
        if out.code != 0:
            unread = unread or f"{save} failed: {out.last_error_line[:200]}"
            continue
        hinted = hinted or KUBELET_CHAINS.search(out.stdout) is not None
        rules += sum(1 for line in out.stdout.splitlines() if line.startswith("-"))
    return BackendRules(backend=backend, hinted=hinted, rules=rules if count else 0, unread=unread)


def _on_path(tool: str, path: str) -> str | None:
    """The file `tool` leads to where the plugins would find it on `path`, as LookPath does."""
    found = shutil.which(tool, path=path)
    return os.path.realpath(found) if found is not None else None


class PathPlan(Struct, frozen=True, kw_only=True):
    """What the plugins' PATH should be this pass."""

    choice: BackendChoice
    links: tuple[tuple[str, str], ...] = ()  # (tool, target) for the private dir; none: PATH as it is
    problem: str | None = None  # why the chosen backend cannot be given to the plugins

    def describe(self) -> str:
        backend = self.choice.backend
        if backend is None:
            return f"plugin DELs use the iptables on their PATH: {self.choice.reason}"
        if self.problem is not None:
            return f"plugin DELs should use iptables {backend} ({self.choice.reason}) but {self.problem}"
        how = "from a private dir first on their PATH" if self.links else "the iptables on their PATH already is"
        return f"plugin DELs use iptables {backend} ({self.choice.reason}); {how}"


def plan_plugin_path(
    base_path: str,
    *,
    dirs: Sequence[str] = SYSTEM_DIRS,
    timeout: float = SAVE_TIMEOUT,
    legacy_tables: Mapping[str, str] = LEGACY_TABLES,
) -> PathPlan:
    """Read both backends, choose, and say whether `base_path` runs the choice or which links a private dir needs."""
    tools: dict[Backend, dict[str, SystemTool]] = {}
    missing: dict[Backend, str] = {}
    for backend in BACKENDS:
        try:
            tools[backend] = {tool: trusted_tool(backend_tool(tool, backend), dirs=dirs) for tool in TOOLS}
        except ToolRefused as err:
            missing[backend] = str(err)

    def look(backend: Backend, count: bool) -> BackendRules:
        if backend not in tools:
            return BackendRules(backend=backend, hinted=False, rules=0, unread=missing[backend])
        return read_rules(backend, tools[backend], count=count, timeout=timeout, legacy_tables=legacy_tables)

    # Whole saves (large with kube-proxy's rules) only on a node without kubelet's chains.
    hints = {backend: look(backend, count=False) for backend in BACKENDS}
    if not any(h.hinted for h in hints.values()):
        hints = {backend: look(backend, count=True) for backend in BACKENDS}
    choice = choose_backend(hints["nft"], hints["legacy"])
    if choice.backend is None:
        return PathPlan(choice=choice)
    if choice.backend in missing:
        return PathPlan(choice=choice, problem=missing[choice.backend])
    chosen = tools[choice.backend]
    if all(_on_path(tool, base_path) == chosen[tool].real for tool in TOOLS):
        return PathPlan(choice=choice)
    return PathPlan(choice=choice, links=tuple((tool, chosen[tool].real) for tool in TOOLS))


class GivenPath(Struct, frozen=True, kw_only=True):
    path: str  # what the plugins get as PATH
    problem: str | None = None  # why the private dir could not be made (then `path` is the base)


def _root_alone(directory: str) -> None:
    """Every directory down to `directory` is root's alone or sticky (reaper.host.resolve)."""
    root_fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        resolved = resolve_in_root(root_fd, os.path.abspath(directory), checked=True)
    finally:
        os.close(root_fd)
    if not isinstance(resolved, Resolved):
        raise ToolRefused(f"{directory}: {resolved.reason if resolved is not None else 'gone'}")
    os.close(resolved.fd)


def _check_private(private: str) -> None:
    """`private` is a 0700 directory of this process's, in a directory no one else may change."""
    st = os.lstat(private)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise ToolRefused(f"{private} is not a 0700 directory of this process's")
    _root_alone(private)


def _fixed_dir(path: str) -> str:
    """`path` made afresh, 0700, in a directory no one else may change (a killed pass's left
    first); the caller's lock makes the name its own."""
    _root_alone(os.path.dirname(os.path.abspath(path)))
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.mkdir(path, 0o700)
    return path


def _make_private(links: Sequence[tuple[str, str]], beside: str | None) -> tuple[str | None, str | None]:
    """(the private dir with `links` in it, None), or (None, why none could be made): first
    `<beside>.iptables`, then a mkdtemp dir."""
    problems = []
    makers: list[Callable[[], str]] = [functools.partial(_fixed_dir, f"{beside}.iptables")] if beside else []
    makers.append(functools.partial(tempfile.mkdtemp, prefix=_PRIVATE_PREFIX))
    for make in makers:
        private = None
        try:
            private = make()
            _check_private(private)
            dir_fd = os.open(private, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                for tool, target in links:
                    os.symlink(target, tool, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
        except (OSError, ToolRefused) as err:
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)
            if isinstance(err, OSError):
                problems.append(f"{err.filename}: {describe_oserror(err)}" if err.filename else describe_oserror(err))
            else:
                problems.append(str(err))
            continue
        return private, None
    return None, f"no private dir for the iptables links: {'; '.join(problems)}"


@contextlib.contextmanager
def plugin_path(plan: PathPlan | None, base_path: str, *, beside: str | None = None) -> Iterator[GivenPath]:
    """The PATH plugins get while the block runs: `base_path`, behind the plan's private dir
    (removed at the end) when it has links. `beside`: a file whose lock the caller holds."""
    if plan is None or not plan.links:
        yield GivenPath(path=base_path)
        return
    private, problem = _make_private(plan.links, beside)
    if private is None:
        yield GivenPath(path=base_path, problem=problem)
        return
    try:
        yield GivenPath(path=f"{private}:{base_path}")
    finally:
        shutil.rmtree(private, ignore_errors=True)
