"""Command-line flags and their REAPER_* environment variables, turned into one Settings."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from reaper.durations import parse_duration
from reaper.model import Policy
from reaper.names import compile_netns_patterns

T = TypeVar("T")


class SettingsError(ValueError):
    """A bad flag or environment value; the message is one line for the operator."""


@dataclass(frozen=True)
class Settings:
    netns_dirs: tuple[str, ...]
    netns_patterns: tuple[re.Pattern[str], ...]
    ipam_dirs: tuple[str, ...]
    cni_cache_dir: str
    cni_conf_dir: str
    cni_bin_dirs: tuple[str, ...]
    runtime_endpoint: str | None
    runtime_timeout: float
    policy: Policy
    state_file: str
    json_output: bool
    log_format: str
    log_level: str


@dataclass(frozen=True)
class _Option:
    flag: str
    env: str
    default: str | None
    help: str
    repeatable: bool = False
    metavar: str | None = None


OPTIONS: tuple[_Option, ...] = (
    _Option(
        "--netns-dir",
        "REAPER_NETNS_DIR",
        "/var/run/netns",
        "directory of pinned network namespaces (repeatable)",
        True,
        "DIR",
    ),
    _Option(
        "--netns-pattern",
        "REAPER_NETNS_PATTERN",
        None,
        "regex of pin names your runtime makes, beyond containerd's cni-<uuid> and CRI-O's <uuid> "
        "(repeatable); pins matching none and named by no sandbox or cache entry are never touched",
        True,
        "REGEX",
    ),
    _Option(
        "--ipam-dir",
        "REAPER_IPAM_DIR",
        "/var/lib/cni/networks",
        "host-local IPAM data dir (repeatable); every ipam.dataDir in a config is added",
        True,
        "DIR",
    ),
    _Option(
        "--cni-cache-dir",
        "REAPER_CNI_CACHE_DIR",
        "/var/lib/cni",
        "libcni cache dir (holds results/ and the legacy cache/results/)",
        metavar="DIR",
    ),
    _Option("--cni-conf-dir", "REAPER_CNI_CONF_DIR", "/etc/cni/net.d", "CNI network config dir", metavar="DIR"),
    _Option(
        "--cni-bin-dir",
        "REAPER_CNI_BIN_DIR",
        "/opt/cni/bin",
        "CNI plugin dir (repeatable); processes running from here do not keep a netns alive",
        True,
        "DIR",
    ),
    _Option(
        "--runtime-endpoint",
        "REAPER_RUNTIME_ENDPOINT",
        None,
        "CRI socket, unix:///path; default: the first of containerd, CRI-O, cri-dockerd that answers",
        metavar="URL",
    ),
    _Option("--runtime-timeout", "REAPER_RUNTIME_TIMEOUT", "10s", "deadline of each CRI call", metavar="DURATION"),
    _Option(
        "--min-age",
        "REAPER_MIN_AGE",
        "10m",
        "an attachment younger than this is never an orphan (a slow CNI ADD takes minutes)",
        metavar="DURATION",
    ),
    _Option(
        "--confirmations",
        "REAPER_CONFIRMATIONS",
        "2",
        "consecutive passes an attachment must be seen ownerless before it is an orphan",
        metavar="N",
    ),
    _Option(
        "--stuck-after",
        "REAPER_STUCK_AFTER",
        "15m",
        "report NOTREADY sandboxes older than this as stuck",
        metavar="DURATION",
    ),
    _Option(
        "--state-file",
        "REAPER_STATE_FILE",
        "/var/lib/cni-reaper/state.json",
        "where confirmations are counted between passes and runs",
        metavar="PATH",
    ),
    _Option("--log-format", "REAPER_LOG_FORMAT", "text", "log lines on stderr: text or json", metavar="FORMAT"),
    _Option("--log-level", "REAPER_LOG_LEVEL", "info", "debug, info, warning or error", metavar="LEVEL"),
)


REAP_OPTIONS: tuple[_Option, ...] = (
    _Option("--max-reap", "REAPER_MAX_REAP", "100", "reclaim at most N attachments a pass; the rest wait", metavar="N"),
    _Option(
        "--max-orphan-ratio",
        "REAPER_MAX_ORPHAN_RATIO",
        "0.5",
        "breaker: reclaim nothing (exit 3) when more than this share of the node's attachments look "
        "orphaned, a sign the runtime's list is wrong",
        metavar="RATIO",
    ),
    _Option(
        "--method",
        "REAPER_METHOD",
        "auto",
        "auto: the plugins' DEL first, then the kernel for what is left; kernel: skip DEL",
        metavar="METHOD",
    ),
    _Option(
        "--quarantine-dir",
        "REAPER_QUARANTINE_DIR",
        None,
        "move reclaimed lease and cache files here (under their original path) instead of deleting them",
        metavar="DIR",
    ),
    _Option(
        "--plugin-timeout",
        "REAPER_PLUGIN_TIMEOUT",
        "60s",
        "kill a plugin (and what it started) that runs longer than this",
        metavar="DURATION",
    ),
)


@dataclass(frozen=True)
class ReapSettings:
    max_reap: int
    max_orphan_ratio: float
    kernel_only: bool
    quarantine_dir: str | None
    plugin_timeout: float
    force: bool
    dry_run: bool
    cni_gc: bool


def add_reap_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reclaiming (each also read from its REAPER_* variable)")
    for opt in REAP_OPTIONS:
        default_text = f" [default: {opt.default}]" if opt.default else ""
        group.add_argument(
            opt.flag, default=None, metavar=opt.metavar, help=f"{opt.help}{default_text} (env {opt.env})"
        )
    group.add_argument("--force", action="store_true", help="reclaim even when the breaker would open")
    group.add_argument("--dry-run", action="store_true", help="print the plan (each step and method); change nothing")
    group.add_argument(
        "--cni-gc",
        action="store_true",
        help="after reclaiming, call the CNI 1.1 GC verb on networks that support it, with the live attachments",
    )


def _ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{text!r} must be between 0 and 1")
    return value


def reap_settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ReapSettings:
    env = os.environ if env is None else env
    v = {opt.flag: _values(args, env, opt) for opt in REAP_OPTIONS}
    method = v["--method"][-1]
    if method not in ("auto", "kernel"):
        raise SettingsError(f"--method: {method!r} is not auto or kernel")
    timeout = _parse("--plugin-timeout", v["--plugin-timeout"][-1], parse_duration)
    if timeout <= 0:
        raise SettingsError("--plugin-timeout: must be more than 0")
    quarantine = v["--quarantine-dir"][-1] if v["--quarantine-dir"] else None
    return ReapSettings(
        max_reap=_parse("--max-reap", v["--max-reap"][-1], _positive_int),
        max_orphan_ratio=_parse("--max-orphan-ratio", v["--max-orphan-ratio"][-1], _ratio),
        kernel_only=method == "kernel",
        quarantine_dir=_abs_path("--quarantine-dir", quarantine) if quarantine else None,
        plugin_timeout=timeout,
        force=bool(getattr(args, "force", False)),
        dry_run=bool(getattr(args, "dry_run", False)),
        cni_gc=bool(getattr(args, "cni_gc", False)),
    )


AGENT_OPTIONS: tuple[_Option, ...] = (
    _Option(
        "--mode", "REAPER_MODE", "reap", "reap: reclaim orphans every pass; scan: only report them", metavar="MODE"
    ),
    _Option("--interval", "REAPER_INTERVAL", "60s", "time between passes (10%% jitter)", metavar="DURATION"),
    _Option(
        "--listen",
        "REAPER_LISTEN",
        "127.0.0.1:9753",
        "HOST:PORT for /metrics, /healthz and /readyz",
        metavar="HOST:PORT",
    ),
)


@dataclass(frozen=True)
class AgentSettings:
    mode: str
    interval: float
    listen_host: str
    listen_port: int


def add_agent_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("agent (each also read from its REAPER_* variable)")
    for opt in AGENT_OPTIONS:
        group.add_argument(
            opt.flag, default=None, metavar=opt.metavar, help=f"{opt.help} [default: {opt.default}] (env {opt.env})"
        )


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9753 or [::1]:9753)")
    return host, int(port)


def agent_settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> AgentSettings:
    env = os.environ if env is None else env
    v = {opt.flag: _values(args, env, opt)[-1] for opt in AGENT_OPTIONS}
    if v["--mode"] not in ("scan", "reap"):
        raise SettingsError(f"--mode: {v['--mode']!r} is not scan or reap")
    interval = _parse("--interval", v["--interval"], parse_duration)
    if interval < 1:
        raise SettingsError("--interval: must be at least 1s")
    host, port = _parse("--listen", v["--listen"], parse_listen)
    return AgentSettings(v["--mode"], interval, host, port)


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("paths and policy (each also read from its REAPER_* variable)")
    for opt in OPTIONS:
        default_text = f" [default: {opt.default}]" if opt.default else ""
        group.add_argument(
            opt.flag,
            action="append" if opt.repeatable else "store",
            default=None,
            metavar=opt.metavar,
            help=f"{opt.help}{default_text} (env {opt.env})",
        )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def add_textfile_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--textfile",
        default=os.environ.get("REAPER_TEXTFILE") or None,
        metavar="PATH",
        help="also write the metrics to PATH, atomically, for node_exporter's textfile collector (env REAPER_TEXTFILE)",
    )


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _values(args: argparse.Namespace, env: Mapping[str, str], opt: _Option) -> list[str]:
    given = getattr(args, _dest(opt.flag))
    if given is not None:
        return list(given) if opt.repeatable else [given]
    if opt.env in env and env[opt.env] != "":
        raw = env[opt.env]
        if opt.repeatable:
            sep = "," if opt.flag == "--netns-pattern" else ":"
            return [v for v in raw.split(sep) if v]
        return [raw]
    return [opt.default] if opt.default is not None else []


def _parse(flag: str, text: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(text)
    except ValueError as err:
        raise SettingsError(f"{flag}: {err}") from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{text!r} must be 1 or more")
    return value


def _abs_path(flag: str, path: str) -> str:
    if not path.startswith("/"):
        raise SettingsError(f"{flag}: {path!r} must be an absolute path")
    return os.path.normpath(path)


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    v: dict[str, list[str]] = {opt.flag: _values(args, env, opt) for opt in OPTIONS}

    def one(flag: str) -> str:
        return v[flag][-1]

    def paths(flag: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_abs_path(flag, p) for p in v[flag]))

    try:
        patterns = compile_netns_patterns(tuple(v["--netns-pattern"]))
    except re.error as err:
        raise SettingsError(f"--netns-pattern: invalid regex: {err}") from None
    endpoint = v["--runtime-endpoint"][-1] if v["--runtime-endpoint"] else None
    if endpoint is not None and not (endpoint.startswith("unix:///") and len(endpoint) > 8):
        raise SettingsError(f"--runtime-endpoint: {endpoint!r} must look like unix:///run/containerd/containerd.sock")
    timeout = _parse("--runtime-timeout", one("--runtime-timeout"), parse_duration)
    if timeout <= 0:
        raise SettingsError("--runtime-timeout: must be more than 0")
    log_format = one("--log-format")
    if log_format not in ("text", "json"):
        raise SettingsError(f"--log-format: {log_format!r} is not text or json")
    log_level = one("--log-level").lower()
    if log_level not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"--log-level: {log_level!r} is not debug, info, warning or error")
    return Settings(
        netns_dirs=paths("--netns-dir"),
        netns_patterns=patterns,
        ipam_dirs=paths("--ipam-dir"),
        cni_cache_dir=_abs_path("--cni-cache-dir", one("--cni-cache-dir")),
        cni_conf_dir=_abs_path("--cni-conf-dir", one("--cni-conf-dir")),
        cni_bin_dirs=paths("--cni-bin-dir"),
        runtime_endpoint=endpoint,
        runtime_timeout=timeout,
        policy=Policy(
            min_age=_parse("--min-age", one("--min-age"), parse_duration),
            confirmations=_parse("--confirmations", one("--confirmations"), _positive_int),
            stuck_after=_parse("--stuck-after", one("--stuck-after"), parse_duration),
        ),
        state_file=_abs_path("--state-file", one("--state-file")),
        json_output=bool(getattr(args, "json", False)),
        log_format=log_format,
        log_level=log_level,
    )


def parse_cli(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    return parser.parse_args(list(argv))
