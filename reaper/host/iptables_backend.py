"""Which iptables backend the node uses, and a PATH on which plugin DELs run that backend.

CNI plugins delete their own rules (bridge's ipMasq chain, portmap's hostPort chains, firewall's
CNI-FORWARD rules) with whatever `iptables` comes first on their PATH: go-iptables finds it with
`exec.LookPath("iptables")` and takes the mode from its `--version` ("(nf_tables)", else legacy)
(coreos/go-iptables iptables/iptables.go: New, getIptablesCommand, extractIptablesVersion). The
reaper's image has Debian's iptables, nft by default: on a node whose kubelet and kube-proxy use
legacy, a plugin's DEL from there deletes nothing in the tables the node uses, and succeeds.

The node's backend is read as kube-proxy's iptables-wrapper reads it
(kubernetes-sigs/iptables-wrappers: internal/iptables/detect.go DetectMode, and before it the
wrapper script iptables-wrapper-installer.sh wrote): a kubelet chain (KUBE-IPTABLES-HINT or
KUBE-KUBELET-CANARY) in nft first, then in legacy; with neither, the older wrapper's rule count,
the backend holding more rules. A tie, nothing at all, or a save that could not be read decides
nothing here (the wrapper then takes nft): the plugins keep the PATH they have.

The chains are looked for in the mangle tables alone (`-t mangle`); whole saves, which read
every kube-proxy rule, only on a node without them. Legacy is read only where
/proc/net/ip{,6}_tables_names lists the table asked for (any, for a whole save): asking
iptables-legacy-save for a table the kernel does not have would create it in this netns.
Everything is read in the netns the reaper runs in (the host's, in the chart's hostNetwork pod).

When the chosen backend is not what the plain tools on PATH already are, plugins get a PATH
whose first entry is a private dir (`<state file>.iptables`, made afresh under the pass lock, or
else a mkdtemp dir; 0700, this process's, every directory above it root's alone or sticky)
holding links named `iptables`, `iptables-save`, ... to that backend's tools, found by absolute
path in the system dirs only, each root's alone, never in a CNI bin dir or a PATH entry. The
links are named as the tools are, so a multi-call xtables-*-multi does what its name says. The
dir goes when the pass ends.
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
# Where the node's own tools are: a plugin's link goes to nothing outside these.
SYSTEM_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
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
    """What one backend holds in this netns, both families: in mangle alone while kubelet's
    chains are looked for (rules 0), in every table once rules are counted."""

    backend: Backend
    hinted: bool  # a kubelet chain is in it
    rules: int  # rule lines (`-A ...`) its saves printed
    unread: str | None = None  # why a save could not be read: the count is not all of it


class BackendChoice(Struct, frozen=True, kw_only=True):
    backend: Backend | None  # None: nothing decides; plugins keep their PATH
    reason: str


def choose_backend(nft: BackendRules, legacy: BackendRules) -> BackendChoice:
    """The backend the node uses, by iptables-wrapper's rule: a kubelet chain (nft's first),
    then the backend with more rules; nothing on a tie or where a count is incomplete."""
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


def _root_only(st: os.stat_result) -> bool:
    """Owned by root (or this process's own uid, trusted as reaper.host.resolve trusts it) and
    writable by no one else."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def trusted_tool(name: str, *, dirs: Sequence[str] = SYSTEM_DIRS) -> SystemTool:
    """`name` in the first of `dirs` that has it, when every directory and link on the way is
    root's alone (reaper.host.resolve) and it leads to an executable file owned by root that
    no one else may write. A first one that is not refuses: the next dir is not tried."""
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
                st = os.fstat(resolved.fd)
                real = os.path.realpath(found)
                again = os.stat(real)
            finally:
                os.close(resolved.fd)
            if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111 or not _root_only(st):
                raise ToolRefused(f"{found} is not an executable file that only root may write")
            if (again.st_dev, again.st_ino) != resolved.key:
                raise ToolRefused(f"{found} changed while it was checked")
            return SystemTool(found=found, real=real)
    finally:
        os.close(root_fd)
    raise ToolRefused(f"{name} is in none of {':'.join(dirs)}")


def backend_tools(backend: Backend, *, dirs: Sequence[str] = SYSTEM_DIRS) -> dict[str, SystemTool]:
    """Each of TOOLS as `backend` has it, by tool name; ToolRefused when one is missing."""
    return {tool: trusted_tool(backend_tool(tool, backend), dirs=dirs) for tool in TOOLS}


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
    """What `backend` holds here, read with its own saves: only its mangle table, where kubelet's
    chains are (rules 0), unless `count`. Legacy only where the family's `legacy_tables` file
    lists the table (or, counting, any table): a save never makes the kernel create one."""
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
    """Read both backends here, choose (choose_backend), and say whether the plugins' `base_path`
    already runs the choice or which links a private dir needs."""
    tools: dict[Backend, dict[str, SystemTool]] = {}
    missing: dict[Backend, str] = {}
    for backend in BACKENDS:
        try:
            tools[backend] = backend_tools(backend, dirs=dirs)
        except ToolRefused as err:
            missing[backend] = str(err)

    def look(backend: Backend, count: bool) -> BackendRules:
        if backend not in tools:
            return BackendRules(backend=backend, hinted=False, rules=0, unread=missing[backend])
        return read_rules(backend, tools[backend], count=count, timeout=timeout, legacy_tables=legacy_tables)

    # Kubelet's chains first, from the mangle tables alone; every rule is counted (whole saves,
    # large where kube-proxy's rules are) only on a node without them.
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
    """Every directory down to `directory` is root's alone or sticky (reaper.host.resolve):
    no one else can rename what is in it."""
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
    """`path` made afresh, 0700, in a directory no one else may change: what a pass that was
    killed left there goes first (the caller holds the lock that makes the name its own)."""
    _root_alone(os.path.dirname(os.path.abspath(path)))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.mkdir(path, 0o700)
    return path


def _make_private(links: Sequence[tuple[str, str]], beside: str | None) -> tuple[str | None, str | None]:
    """(the private dir with `links` in it, None), or (None, why none could be made): first
    `<beside>.iptables`, then a mkdtemp dir in the temp dir (a chart's /tmp emptyDir is 0777
    without the sticky bit, which the check refuses; the state file's dir is root's)."""
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
    """The PATH plugins get while the block runs: `base_path`, behind the plan's private dir when
    it has links. `beside`: a file whose lock the caller holds (the state file); the dir is
    `<beside>.iptables` where that can be made safely. The dir is removed when the block ends."""
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
