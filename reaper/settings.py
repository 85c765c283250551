"""Command-line flags and their REAPER_* environment variables: one table, one resolver.

Each option is one row: its flag, its variable, its default, how its text is parsed, how a
variable splits into several values, and the --help group it shows in. A flag beats its
variable, which beats the default. A bad value is a SettingsError with one line for the
operator.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import stat
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from msgspec import Struct
from msgspec.structs import replace

from reaper.durations import ACCEPTED as DURATION_FORMS
from reaper.durations import parse_duration
from reaper.exclusions import Exclusions, name_glob, pod_glob
from reaper.layout import CRIO_RUNTIME, Layout
from reaper.model import Policy
from reaper.names import PLUGIN_TYPE, compile_netns_patterns, is_cni_id
from reaper.options import FindOptions, ReapPolicy
from reaper.podcidr import PodCidrError, pod_cidrs_from, resolve_pod_cidrs

V = TypeVar("V")
Group = Literal["paths", "reap", "agent", "output"]
GROUP_TITLES: dict[Group, str] = {
    "paths": "paths and policy (each also read from its REAPER_* variable)",
    "reap": "reclaiming (each also read from its REAPER_* variable)",
    "agent": "agent (each also read from its REAPER_* variable)",
    "output": "output",
}


# Plugin DELs a reclaiming pass runs at once: the default keeps the agent and a burst of DELs well
# under the chart's 256 MiB limit (bench/del_memory.py); the bound keeps a typo from forking hundreds.
DEL_CONCURRENCY = 4
DEL_CONCURRENCY_MAX = 32


class SettingsError(ValueError):
    """A bad flag or environment value; the message is one line for the operator."""


# ----------------------------------------------------------------------------- parsers


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError("must be an absolute path")
    return os.path.normpath(path)


def _absolute_or_here(path: str) -> str:
    """A file path as typed, made absolute against the working directory."""
    if not path:
        raise ValueError("must not be empty")
    return os.path.abspath(path)


def _not_a_directory(path: str) -> str:
    """A file the reaper writes: a directory there is a mistyped path, not a file to replace
    (a state file found unusable is moved aside: never a directory, such as /var/lib/cni)."""
    if os.path.isdir(path):
        raise ValueError(f"is a directory: name a file, like {os.path.join(path, 'FILE')}")
    parent = os.path.dirname(path)
    if os.path.lexists(parent) and not os.path.isdir(parent):  # makedirs would say "File exists"
        raise ValueError(f"{parent} is not a directory")
    return path


def _absolute_file(path: str) -> str:
    return _not_a_directory(_absolute(path))


def _file_here(path: str) -> str:
    return _not_a_directory(_absolute_or_here(path))


def _absolute_dir(path: str) -> str:
    """A dir the reaper makes when missing; a file there is a mistyped path."""
    full = _absolute(path)
    if os.path.lexists(full) and not os.path.isdir(full):
        raise ValueError("is not a directory")
    return full


def _parser(
    convert: Callable[[str], V], fits: Callable[[V], object], problem: str, unreadable: str | None = None
) -> Callable[[str], V]:
    """A parser: `convert`'s value when `fits` takes it, else ValueError(`problem`); `unreadable`
    replaces the message of a ValueError from `convert`."""

    def parse(text: str) -> V:
        try:
            value = convert(text)
        except ValueError:
            if unreadable is None:
                raise
            raise ValueError(unreadable) from None
        if not fits(value):
            raise ValueError(problem)
        return value

    return parse


def _count_within(low: int, high: int) -> Callable[[str], int]:
    fits = f"from {low} to {high}"
    return _parser(int, lambda value: low <= value <= high, f"must be {fits}", f"not a whole number {fits}")


_count = _parser(int, lambda value: value >= 1, "must be 1 or more", "not a whole number")
_ratio = _parser(float, lambda value: 0.0 <= value <= 1.0, "must be between 0 and 1", "not a number")
_positive_duration = _parser(parse_duration, lambda value: value > 0, "must be more than 0")
_interval = _parser(parse_duration, lambda value: value >= 1, "must be at least 1s")


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.lower()
        if value not in choices:
            raise ValueError(f"must be {', '.join(choices[:-1])} or {choices[-1]}")
        return value

    return parse


def _on_off(text: str) -> bool:
    value = text.lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{text!r} is not on or off")


_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_namespace = _parser(str, _NAMESPACE.fullmatch, "not a namespace name (lowercase letters, digits and '-', at most 63)")
_endpoint = _parser(
    str,
    lambda text: text.startswith("unix:///") and len(text) > len("unix:///"),
    "must look like unix:///run/containerd/containerd.sock",
)
_plugin_type = _parser(str, PLUGIN_TYPE.fullmatch, "not a plugin type name (letters, digits, '.', '_', '-')")
_container_id = _parser(str, is_cni_id, "not a container ID (letters, digits, '.', '_', '-')")


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as err:
        raise ValueError(f"invalid regex: {err}") from None
    return text


def _pod_cidr(text: str) -> str:
    try:
        pod_cidrs_from([text], "--pod-cidr")
    except PodCidrError:
        raise ValueError("not a network in CIDR notation (like 10.244.3.0/24)") from None
    return text


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("not HOST:PORT (e.g. 127.0.0.1:9753 or [::1]:9753)")
    return host, int(port)


# ------------------------------------------------------------------------------ the table


class Option(Struct, frozen=True):
    flag: str
    env: str | None  # None: a flag only
    default: str | None
    help: str
    group: Group
    parse: Callable[[str], Any] = str
    separator: str | None = None  # repeatable; a variable holds several values split on this
    metavar: str | None = None
    switch: bool = False  # a flag without a value: on when given
    lines: bool = False  # its variable holding a newline is split on newlines instead (one a line)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("--netns-dir", "REAPER_NETNS_DIR", "/var/run/netns", "directory of pinned network namespaces (repeatable)",
           "paths", _absolute, ":", "DIR"),
    Option("--namespaces-dir", "REAPER_NAMESPACES_DIR", None,
           "CRI-O's namespaces_dir (repeatable): its {ipc,uts,user,pid}ns pins are reclaimed with the pin of the "
           "same name in DIR/netns, which must be a --netns-dir; default: from CRI-O's config, when it has one",
           "paths", _absolute, ":", "DIR"),
    Option("--netns-pattern", "REAPER_NETNS_PATTERN", None,
           "regex of pin names your runtime makes, beyond containerd's cni-<uuid> and CRI-O's <uuid> (repeatable; "
           "its variable holds one a line, or several on one line split on ','); pins matching none and named by "
           "no sandbox or cache entry are never touched",
           "paths", _regex, ",", "REGEX", lines=True),
    Option("--ipam-dir", "REAPER_IPAM_DIR", "/var/lib/cni/networks",
           "host-local IPAM data dir (repeatable); every ipam.dataDir in a config is added", "paths", _absolute, ":",
           "DIR"),
    Option("--cni-cache-dir", "REAPER_CNI_CACHE_DIR", "/var/lib/cni",
           "libcni cache dir (holds results/ and the legacy cache/results/)", "paths", _absolute, metavar="DIR"),
    Option("--cni-conf-dir", "REAPER_CNI_CONF_DIR", "/etc/cni/net.d", "CNI network config dir", "paths", _absolute,
           metavar="DIR"),
    Option("--cni-bin-dir", "REAPER_CNI_BIN_DIR", "/opt/cni/bin",
           "CNI plugin dir (repeatable); processes running from here do not keep a netns alive", "paths", _absolute,
           ":", "DIR"),
    Option("--pod-cidr", "REAPER_POD_CIDR", None,
           "the node's pod CIDR (repeatable, one per family), for host-local ranges whose subnet is usePodCidr "
           "(Calico, Canal); in a pod with --node-name it is read from the Node object instead",
           "paths", _pod_cidr, ",", "CIDR"),
    Option("--node-name", "REAPER_NODE_NAME", None,
           "this node's Kubernetes name; in a pod, its spec.podCIDRs are read with the pod's service account "
           "(see --pod-cidr-from-node) and the agent's Events are posted on it", "paths", metavar="NAME"),
    Option("--pod-cidr-from-node", "REAPER_POD_CIDR_FROM_NODE", "on",
           "in a pod with --node-name, read the Node's spec.podCIDRs (on) or never ask (off: for a service "
           "account that may post Events but not get nodes)", "paths", _on_off, metavar="on|off"),
    Option("--runtime-endpoint", "REAPER_RUNTIME_ENDPOINT", None,
           "CRI socket, unix:///path (repeatable; when given, exactly these are asked); default: the kubelet's "
           "configured endpoint and every known socket that exists (containerd, CRI-O, cri-dockerd, k3s/rke2, "
           "microk8s), all of them asked, and one that cannot be (a crashed runtime's socket) makes the pass "
           "wait: name the runtimes that serve pods when one is gone for good", "paths", _endpoint, ",", "URL"),
    Option("--runtime-timeout", "REAPER_RUNTIME_TIMEOUT", "10s", "deadline of each CRI call", "paths",
           _positive_duration, metavar="DURATION"),
    Option("--min-age", "REAPER_MIN_AGE", "10m",
           "an attachment younger than this is never an orphan (a slow CNI ADD takes minutes; under 1m warns: "
           "pods being created were harmed at 0)", "paths", parse_duration, metavar="DURATION"),
    Option("--confirmations", "REAPER_CONFIRMATIONS", "2",
           "consecutive passes an attachment must be seen ownerless before it is an orphan; a pass counts only "
           "half of --interval (REAPER_INTERVAL, else 60s: 30s) or more after the one that last counted, so runs "
           "made seconds apart (a scan, then reap --dry-run) count once", "paths", _count, metavar="N"),
    Option("--stuck-after", "REAPER_STUCK_AFTER", "15m", "report NOTREADY sandboxes older than this as stuck", "paths",
           parse_duration, metavar="DURATION"),
    Option("--exclude-namespace", "REAPER_EXCLUDE_NAMESPACE", None,
           "never reclaim attachments of pods in a namespace matching GLOB (repeatable); the pod is read from the "
           "cache entry's CNI_ARGS, so an attachment without one matches no namespace", "paths", name_glob, ",",
           "GLOB"),
    Option("--exclude-pod", "REAPER_EXCLUDE_POD", None,
           "never reclaim attachments of pods matching NAMESPACE/NAME, either part a glob (repeatable)", "paths",
           pod_glob, ",", "NS/NAME"),
    Option("--exclude-network", "REAPER_EXCLUDE_NETWORK", None,
           "never reclaim attachments on a network whose name matches GLOB (repeatable)", "paths", name_glob, ",",
           "GLOB"),
    Option("--state-file", "REAPER_STATE_FILE", "/var/lib/cni-reaper/state.json",
           "where confirmations are counted between passes and runs", "paths", _absolute_file, metavar="PATH"),
    Option("--lock-wait", "REAPER_LOCK_WAIT", "60s",
           "how long to wait while another reaper on this node holds the lock beside --state-file (its pass "
           "under way); then exit 4 naming it (the agent skips that pass); 0: do not wait", "paths",
           parse_duration, metavar="DURATION"),
    Option("--log-format", "REAPER_LOG_FORMAT", "text", "log lines on stderr: text or json", "paths",
           _one_of("text", "json"), metavar="FORMAT"),
    Option("--log-level", "REAPER_LOG_LEVEL", "info", "debug, info, warning or error", "paths",
           _one_of("debug", "info", "warning", "error"), metavar="LEVEL"),
    Option("--json", None, None, "print one JSON object instead of the table", "output", switch=True),
    Option("--textfile", "REAPER_TEXTFILE", None,
           "also write the metrics to PATH, atomically, for node_exporter's textfile collector", "output",
           _file_here, metavar="PATH"),
    Option("--max-reap", "REAPER_MAX_REAP", "100",
           "reclaim at most N attachments a pass that a wrong verdict could cost a pod something (an address, a "
           "pin, a veth, a file a DEL may need); the rest wait. A loopback's cache entry alone, in no namespace "
           "(cni-loopback, lo, only loopback addresses) costs none and is not counted: up to 1,000 of those go "
           "besides, a bound for the pass's time", "reap", _count, metavar="N"),
    Option("--max-orphan-ratio", "REAPER_MAX_ORPHAN_RATIO", "0.5",
           "breaker: reclaim nothing (exit 3) when more than this share of the node's attachments look orphaned, "
           "a sign the runtime's list is wrong", "reap", _ratio, metavar="RATIO"),
    Option("--method", "REAPER_METHOD", "auto",
           "auto: the plugins' DEL first, then the kernel for what is left; kernel: skip DEL", "reap",
           _one_of("auto", "kernel"), metavar="METHOD"),
    Option("--quarantine-dir", "REAPER_QUARANTINE_DIR", None,
           "move reclaimed lease and cache files here (under their original path) instead of deleting them", "reap",
           _absolute_dir, metavar="DIR"),
    Option("--quarantine-max-age", "REAPER_QUARANTINE_MAX_AGE", "7d",
           "with --quarantine-dir: at the start of each reclaiming pass, delete what the reaper moved there longer "
           "ago than this (by the time it wrote in the name of each DIR/<time>/ dir; nothing else there)", "reap",
           _positive_duration, metavar="DURATION"),
    Option("--plugin-timeout", "REAPER_PLUGIN_TIMEOUT", "60s",
           "kill a plugin (and what it started) that runs longer than this", "reap",
           _positive_duration, metavar="DURATION"),
    Option("--del-concurrency", "REAPER_DEL_CONCURRENCY", str(DEL_CONCURRENCY),
           f"plugin DELs run at once, 1 to {DEL_CONCURRENCY_MAX}: each is a process beside the reaper, so this "
           "bounds a reclaim burst's memory; the default keeps the agent and its DELs well under the chart's "
           "256 MiB limit (raise it with the limit)", "reap", _count_within(1, DEL_CONCURRENCY_MAX), metavar="N"),
    Option("--allow-plugin", "REAPER_ALLOW_PLUGIN", None,
           "a plugin type a cache entry's config may run for DEL though no config in the conf dir uses it "
           "(repeatable); by default a cached config runs only the plugins the node's own configs use",
           "reap", _plugin_type, ",", "TYPE"),
    Option("--force", None, None,
           "reclaim even when the breaker would open, or in a process whose REAPER_MODE is scan", "reap",
           switch=True),
    Option("--dry-run", None, None, "print the plan (each step and method); change nothing", "reap", switch=True),
    Option("--plan-out", None, None,
           "with --dry-run: also write the plan to PATH, for review and a later --plan", "reap", _file_here,
           metavar="PATH"),
    Option("--plan", None, None,
           "reclaim only what PATH (a --plan-out file made on this node since its last boot) reviewed, and only "
           "while each is still an orphan with the same resources and steps; every other orphan is skipped",
           "reap", _absolute_or_here, metavar="PATH"),
    Option("--drop-waiting", None, None,
           "with --dry-run or --plan: reclaim as files the `waiting` cache entries (and the other files their "
           "DEL would read) of container ID, once the plugin's own tools freed what they record (repeatable); "
           "no DEL runs. With --plan, only an entry that plan reviewed",
           "reap", _container_id, ",", "ID"),
    Option("--mode", "REAPER_MODE", "scan",
           "scan: only report orphans (report-only, the default); reap: reclaim them every pass. With "
           "REAPER_MODE=scan, a `reaper reap` in the same pod or environment is refused unless --force",
           "agent", _one_of("scan", "reap"), metavar="MODE"),
    Option("--interval", "REAPER_INTERVAL", "60s", "time between passes (10%% jitter)", "agent",
           _interval, metavar="DURATION"),
    Option("--stall-after", "REAPER_STALL_AFTER", "30m",
           "/healthz fails while a pass has run longer than this: a wedged agent is restarted by its liveness probe",
           "agent", _positive_duration, metavar="DURATION"),
    Option("--events", "REAPER_EVENTS", "on",
           "post Kubernetes Events on this node's Node object (--node-name, in a pod with a service account): "
           "leaks reclaimed, breaker open, an IP range nearly full, stuck sandboxes; off outside a pod",
           "agent", _on_off, metavar="on|off"),
    Option("--events-namespace", "REAPER_EVENTS_NAMESPACE", "default",
           "the namespace the Node's Events are posted in (the chart's events.namespace, where its Role lets them "
           "be written); `kubectl describe node` finds them in any", "agent", _namespace, metavar="NAMESPACE"),
    Option("--listen", "REAPER_LISTEN", "127.0.0.1:9753", "HOST:PORT for /metrics, /healthz and /readyz", "agent",
           parse_listen, metavar="HOST:PORT"),
)  # fmt: skip


def add_options(parser: argparse.ArgumentParser, groups: tuple[Group, ...], skip: tuple[str, ...] = ()) -> None:
    """Every option of `groups` (but the flags in `skip`) on `parser`, under its group's title.
    The first group with a DURATION says, once, what a duration may be written as."""
    durations_said = False
    for group in groups:
        options = [o for o in OPTIONS if o.group == group and o.flag not in skip]
        described = not durations_said and any(o.metavar == "DURATION" for o in options)
        durations_said = durations_said or described
        # argparse formats help with %-style: the description's own % must be doubled.
        description = f"DURATION: {DURATION_FORMS}".replace("%", "%%") if described else None
        section = parser.add_argument_group(GROUP_TITLES[group], description)
        for opt in options:
            if opt.switch:
                section.add_argument(opt.flag, action="store_true", help=opt.help)
                continue
            default_text = f" [default: {opt.default}]" if opt.default else ""
            env_text = f" (env {opt.env})" if opt.env else ""
            section.add_argument(
                opt.flag,
                action="append" if opt.separator else "store",
                default=None,
                metavar=opt.metavar,
                help=f"{opt.help}{default_text}{env_text}",
            )


def _texts(opt: Option, args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """Where the option's text comes from (its flag, its variable or "default") and the texts."""
    given = getattr(args, opt.dest, None)
    if given is not None:
        return opt.flag, list(given) if opt.separator else [given]
    raw = env.get(opt.env, "") if opt.env else ""
    if raw and opt.env:
        return opt.env, variable_texts(opt, raw)
    return "default", [opt.default] if opt.default is not None else []


def variable_texts(opt: Option, raw: str) -> list[str]:
    """The texts the option's variable holds: a repeatable option's split on its separator, or on
    newlines when it takes lines and the value holds one (a regex may hold the ','); empty ones
    skipped, as a separator at either end or two in a row leave."""
    if not opt.separator:
        return [raw]
    separator = "\n" if opt.lines and "\n" in raw else opt.separator
    return [v for v in raw.split(separator) if v]


def _shown(text: str) -> str:
    """A value as an error line quotes it: repr, so blanks and control characters show, cut short."""
    return repr(text) if len(text) <= 80 else repr(text[:80]) + "..."


def resolve(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every option's value, parsed, by dest: a list for repeatable ones (duplicates dropped),
    else one value or None. Options the command does not have take their default."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        if opt.switch:
            values[opt.dest] = bool(getattr(args, opt.dest, False))
            continue
        parsed = []
        source, texts = _texts(opt, args, env)
        for text in texts:
            try:
                parsed.append(opt.parse(text))
            except ValueError as err:
                # What was typed, where: `REAPER_MIN_AGE='-5': must not be negative`.
                name = opt.flag if source == "default" else source
                raise SettingsError(f"{name}={_shown(text)}: {err}") from None
        values[opt.dest] = list(dict.fromkeys(parsed)) if opt.separator else (parsed[-1] if parsed else None)
    return values


# ------------------------------------------------------------------------------ settings


class Settings(Struct, frozen=True, kw_only=True):
    find: FindOptions  # the dirs and pin names the look reads, as the flags and layout give them
    runtime_endpoints: tuple[str, ...]
    runtime_timeout: float
    policy: Policy
    state_file: str
    json_output: bool
    log_format: str
    log_level: str
    textfile: str | None = None
    lock_wait: float = 60.0  # seconds a pass waits for another reaper's (reaper.host.passlock)
    # (flag, where its value came from: "flag", its variable, "default" or the runtime configs
    # it was detected in) for the dirs layout detection may fill in
    origins: tuple[tuple[str, str], ...] = ()
    layout_problems: tuple[str, ...] = ()  # runtime configs found but not readable, no pod CIDR
    # What the operator gave that would quietly do nothing (a dir a flag or variable names that
    # is not there, a REAPER_* variable nothing reads): each command warns, its JSON says so.
    given_problems: tuple[str, ...] = ()
    pod_cidr_values: tuple[str, ...] = ()
    node_name: str | None = None
    pod_cidr_from_node: bool = True  # in a pod with node_name, ask the API for its pod CIDRs


class ReapSettings(Struct, frozen=True, kw_only=True):
    policy: ReapPolicy  # what the plan weighs: --max-reap, the breaker, --method, the quarantine
    plugin_timeout: float
    quarantine_max_age: float = 7 * 86400.0  # --quarantine-max-age
    dry_run: bool
    allow_plugins: tuple[str, ...] = ()
    del_concurrency: int = DEL_CONCURRENCY  # plugin DELs run at once
    plan_out: str | None = None  # with dry_run: where the plan is written for review
    plan: str | None = None  # a reviewed plan: only what it names, unchanged, is reclaimed
    # Container IDs whose `waiting` entries go as files (reaper.reap.run), with dry_run or plan only
    drop_waiting: tuple[str, ...] = ()


class AgentSettings(Struct, frozen=True, kw_only=True):
    mode: str
    interval: float
    listen_host: str
    listen_port: int
    stall_after: float
    events: bool = False  # post Kubernetes Events on the Node (reaper.events), when in a pod
    events_namespace: str = "default"  # where they are posted


def _option(flag: str) -> Option:
    return next(o for o in OPTIONS if o.flag == flag)


def given(flag: str, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> str | None:
    """Where an option's value came from when the operator gave it: "flag" or its variable."""
    opt = _option(flag)
    if getattr(args, opt.dest, None) is not None:
        return "flag"
    if opt.env and (os.environ if env is None else env).get(opt.env):
        return opt.env
    return None


def given_as(flag: str, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> str | None:
    """The flag or the variable the operator gave the option's value with; None when neither."""
    origin = given(flag, args, env)
    return flag if origin == "flag" else origin


# What layout detection may fill in, when neither a flag nor a variable gave it.
DETECTED = ("--cni-conf-dir", "--cni-bin-dir", "--netns-dir")

# Dirs whose absence only shows as nothing found: a mistyped one must say so. (A missing bin dir
# is doctor's: its plugins check names what cannot run.)
READ_DIRS = ("--netns-dir", "--ipam-dir", "--cni-cache-dir", "--cni-conf-dir")


# REAPER_* variables read outside the option table: the chart's CNI and platform presets (for
# doctor) and the service account dir a test points the pod CIDR lookup at (reaper.podcidr).
OTHER_VARIABLES = ("REAPER_CNI_PRESET", "REAPER_PLATFORM", "REAPER_SERVICEACCOUNT_DIR")


def unknown_variables(env: Mapping[str, str]) -> tuple[str, ...]:
    """One line for each REAPER_* variable set that nothing reads: a typo there is otherwise a
    setting silently left at its default (REAPER_MINAGE=1h and min-age still 10m)."""
    known = [o.env for o in OPTIONS if o.env] + list(OTHER_VARIABLES)
    problems = []
    for name in sorted(k for k in env if k.startswith("REAPER_") and k not in known):
        # Compared without the prefix every name shares, which would make any two look alike.
        close = difflib.get_close_matches(name.removeprefix("REAPER_"), [k.removeprefix("REAPER_") for k in known], 1)
        hint = f" (did you mean REAPER_{close[0]}?)" if close else ""
        problems.append(f"{name[:80]} is set but the reaper reads no such variable{hint}")
    return tuple(problems)


def dir_problems(values: Mapping[str, Any], args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, ...]:
    """One line for each dir a flag or variable gave that is not a directory here (a default or
    a detected dir that is missing is a node without that runtime or plugin, not a typo)."""
    problems = []
    for flag in READ_DIRS:
        source, value = given_as(flag, args, env), values[_option(flag).dest]
        for path in (value if isinstance(value, list) else [value]) if source else []:
            try:
                problem = "" if stat.S_ISDIR(os.stat(path).st_mode) else "not a directory; nothing is found there"
            except FileNotFoundError:
                problem = "no such directory; nothing is found there"
            except OSError as err:
                problem = f"cannot be read: {err.strerror}"
            if problem:
                problems.append(f"{source} {path}: {problem}")
    return tuple(problems)


def settings_from(
    args: argparse.Namespace, env: Mapping[str, str] | None = None, layout: Layout | None = None
) -> Settings:
    """The settings; with a `layout` (reaper.layout.detect_layout), the dirs neither a flag nor
    a variable gave come from the runtimes' own configs, and `origins` says so."""
    env = os.environ if env is None else env
    v = resolve(args, env)
    given_problems = (*dir_problems(v, args, env), *unknown_variables(env), *_grace_problems(v, args, env))
    origins = {flag: given(flag, args, env) or "default" for flag in DETECTED}
    more_conf_dirs: tuple[str, ...] = ()
    namespaces_dirs = tuple(v["namespaces_dir"]) or _crio_namespaces_dirs(layout)
    if v["namespaces_dir"]:
        origins["--namespaces-dir"] = given("--namespaces-dir", args, env) or "default"
    elif namespaces_dirs:
        origins["--namespaces-dir"] = "CRI-O's netns dir's parent"
    if layout is not None and layout.runtimes:
        sources = ", ".join(f"{r.runtime} ({', '.join(r.sources)})" for r in layout.runtimes)
        if origins["--cni-conf-dir"] == "default" and layout.conf_dir is not None:
            v["cni_conf_dir"], origins["--cni-conf-dir"] = layout.conf_dir, sources
            more_conf_dirs = layout.conf_dirs[1:]
        if origins["--cni-bin-dir"] == "default":
            v["cni_bin_dir"], origins["--cni-bin-dir"] = list(layout.bin_dirs), sources
        if origins["--netns-dir"] == "default":
            v["netns_dir"], origins["--netns-dir"] = list(layout.netns_dirs), sources
    return Settings(
        find=FindOptions(
            netns_dirs=tuple(v["netns_dir"]),
            ipam_dirs=tuple(v["ipam_dir"]),
            cache_dir=v["cni_cache_dir"],
            conf_dir=v["cni_conf_dir"],
            bin_dirs=tuple(v["cni_bin_dir"]),
            netns_patterns=compile_netns_patterns(tuple(v["netns_pattern"])),
            more_conf_dirs=more_conf_dirs,
            namespaces_dirs=namespaces_dirs,
        ),
        runtime_endpoints=tuple(v["runtime_endpoint"]),
        runtime_timeout=v["runtime_timeout"],
        policy=Policy(
            min_age=v["min_age"],
            confirmations=v["confirmations"],
            stuck_after=v["stuck_after"],
            confirmation_spacing=confirmation_spacing(v["interval"]),
            exclusions=Exclusions(
                namespaces=tuple(v["exclude_namespace"]),
                pods=tuple(v["exclude_pod"]),
                networks=tuple(v["exclude_network"]),
            ),
        ),
        state_file=v["state_file"],
        json_output=v["json"],
        log_format=v["log_format"],
        log_level=v["log_level"],
        textfile=v["textfile"],
        lock_wait=v["lock_wait"],
        origins=tuple(origins.items()),
        layout_problems=layout.problems if layout is not None else (),
        given_problems=given_problems,
        pod_cidr_values=tuple(v["pod_cidr"]),
        node_name=v["node_name"],
        pod_cidr_from_node=v["pod_cidr_from_node"],
    )


def confirmation_spacing(interval: float) -> float:
    """How long after the pass that last raised an attachment's ownerless count the next may raise
    it: half the interval, so each agent pass counts (10% jitter) and one-shots seconds apart count
    once (docs/design.md, "Confirmation spacing")."""
    return interval / 2


# Below this, --min-age let the README's churn run call pods still being created orphans.
MIN_AGE_WARNING = 60.0


def _grace_problems(values: Mapping[str, Any], args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, ...]:
    """A warning for a --min-age given under a minute: taken (a lab or a test wants it), but an
    attachment's age is all that tells a pod's ADD still under way from a leak."""
    source = given_as("--min-age", args, env)
    if source is None or values["min_age"] >= MIN_AGE_WARNING:
        return ()
    return (
        f"{source} {values['min_age']:g}s is under 1m: an attachment of a pod whose network is still "
        "being set up may be called an orphan (pods were harmed at 0 in the README's churn run); keep it above "
        "your slowest RunPodSandbox",
    )


def _crio_namespaces_dirs(layout: Layout | None) -> tuple[str, ...]:
    """CRI-O's namespaces_dir, the parent of the netns dir its config gives: only a runtime that
    pins with pinns keeps a sandbox's other namespaces there."""
    runtimes = layout.runtimes if layout is not None else ()
    return tuple(dict.fromkeys(os.path.dirname(r.netns_dir) for r in runtimes if r.runtime == CRIO_RUNTIME))


def with_pod_cidrs(settings: Settings, env: Mapping[str, str] | None = None) -> Settings:
    """The settings with the node's pod CIDRs (reaper.podcidr); when they cannot be learnt, a
    layout problem says why, and ranges that need them are left out of the gauges."""
    try:
        node = settings.node_name if settings.pod_cidr_from_node else None
        cidrs = resolve_pod_cidrs(settings.pod_cidr_values, node, os.environ if env is None else env)
    except PodCidrError as err:
        return replace(settings, layout_problems=(*settings.layout_problems, f"pod CIDR: {err}"))
    return replace(settings, find=replace(settings.find, pod_cidrs=cidrs))


def reap_settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ReapSettings:
    v = resolve(args, env)
    return ReapSettings(
        policy=ReapPolicy(
            max_reap=v["max_reap"],
            max_orphan_ratio=v["max_orphan_ratio"],
            kernel_only=v["method"] == "kernel",
            quarantine_dir=v["quarantine_dir"],
            force=v["force"],
        ),
        quarantine_max_age=v["quarantine_max_age"],
        plugin_timeout=v["plugin_timeout"],
        dry_run=v["dry_run"],
        allow_plugins=tuple(v["allow_plugin"]),
        del_concurrency=v["del_concurrency"],
        plan_out=v["plan_out"],
        plan=v["plan"],
        drop_waiting=tuple(v["drop_waiting"]),
    )


def scan_mode_refusal(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> str | None:
    """Why a one-shot `reaper reap` must not act here, or None: REAPER_MODE=scan says the pod is
    report-only, unless --dry-run or --force (docs/design.md, "A reap in a scan-mode pod")."""
    mode = (os.environ if env is None else env).get("REAPER_MODE", "")
    if mode.lower() != "scan" or getattr(args, "dry_run", False) or getattr(args, "force", False):
        return None
    return (
        "REAPER_MODE is scan here (report-only): this reap would change the node; give --dry-run to see "
        "the plan, or --force to reclaim anyway"
    )


def agent_settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> AgentSettings:
    v = resolve(args, env)
    host, port = v["listen"]
    return AgentSettings(
        mode=v["mode"],
        interval=v["interval"],
        listen_host=host,
        listen_port=port,
        stall_after=v["stall_after"],
        events=v["events"],
        events_namespace=v["events_namespace"],
    )
