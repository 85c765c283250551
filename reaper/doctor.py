"""`reaper doctor`: everything an operator must know before trusting the reaper on a node, one
line a check, `ok`, `warn` or `fail` with the fix. A `fail` is what would leave the reaper blind
(it would see leaks that are not, or none at all) or unable to reclaim safely."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from msgspec import Struct

from reaper.host.files import describe_oserror
from reaper.host.mounts import unpin_hazard
from reaper.host.nsmounts import held_elsewhere, netns_mounts, own_mount_namespace
from reaper.host.procs import unseen_processes
from reaper.kinds.iptables import iptables_tools
from reaper.kinds.netconf import ConfigError, collect_configs_of, plugin_list
from reaper.kinds.nftables import present_cni_tables
from reaper.layout import Layout
from reaper.model import NetworkConfig, RuntimeView
from reaper.podcidr import PodCidrs
from reaper.reap.trust import executed_types
from reaper.settings import Settings

Status = Literal["ok", "warn", "fail"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail")

# Plugins whose DEL talks to a daemon on the node: the socket must be reachable from where the
# reaper runs (in the chart: mounted), or their DEL fails and what they hold off the node stays.
DAEMON_SOCKETS: Mapping[str, tuple[str, str]] = {
    "cilium-cni": ("/var/run/cilium/cilium.sock", "cilium"),
    "multus-shim": ("/run/multus/multus.sock", "multus"),
    "dhcp": ("/run/cni/dhcp.sock", "dhcp"),
}
# Plugins that reach their datastore through a kubeconfig or files on the node.
DAEMON_DIRS: Mapping[str, tuple[str, str]] = {
    "calico": ("/var/lib/calico", "calico"),
    "calico-ipam": ("/var/lib/calico", "calico"),
}
SAVE_TIMEOUT = 30.0
# The chart's cniPreset values, and the plugin types that mark each CNI in the node's configs.
PRESET_PLUGINS: Mapping[str, frozenset[str]] = {
    "calico": frozenset({"calico", "calico-ipam"}),
    "cilium": frozenset({"cilium-cni"}),
    "multus": frozenset({"multus", "multus-shim"}),
    "flannel": frozenset({"flannel"}),
    "aws-vpc-cni": frozenset({"aws-cni"}),
}


class Check(Struct, frozen=True):
    name: str
    status: Status
    message: str
    fix: str = ""


def _dirs(settings: Settings, layout: Layout) -> Iterator[Check]:
    origins = dict(settings.origins)
    for problem in layout.problems:
        yield Check(
            "layout", "warn", f"a runtime config could not be read: {problem}", "fix the file, or pass the dirs"
        )
    for flag, value in (
        ("--cni-conf-dir", ":".join(settings.cni_conf_dirs)),
        ("--cni-bin-dir", ":".join(settings.cni_bin_dirs)),
        ("--netns-dir", ":".join(settings.netns_dirs)),
    ):
        yield Check("layout", "ok", f"{flag} {value} (from {origins.get(flag, 'default')})")


def _readable(name: str, path: str, fix: str, missing: Status = "fail") -> Check:
    try:
        os.listdir(path)
    except FileNotFoundError:
        return Check(name, missing, f"{path} does not exist here", fix)
    except OSError as err:
        return Check(name, "fail", f"{path}: {describe_oserror(err)}", fix)
    return Check(name, "ok", f"{path} readable")


def _cni_dirs(settings: Settings, configs: list[NetworkConfig]) -> Iterator[Check]:
    mount = "mount it into the reaper (the chart's hostPath values), or pass the right path"
    conf = [_readable("conf dir", d, mount) for d in settings.cni_conf_dirs]
    yield from conf
    if any(c.status == "ok" for c in conf):
        if configs:
            names = ", ".join(sorted({c.name for c in configs}))
            yield Check("conf dir", "ok", f"{len(configs)} network config(s): {names}")
        else:
            yield Check("conf dir", "warn", f"no network config in {':'.join(settings.cni_conf_dirs)}", mount)
    for directory in settings.cni_bin_dirs:
        yield _readable("bin dir", directory, mount)
    yield _readable("cache dir", settings.cni_cache_dir, mount, missing="warn")
    for directory in settings.netns_dirs:
        yield _readable("netns dir", directory, mount, missing="warn")
    for directory in settings.ipam_dirs:
        yield _readable("ipam dir", directory, mount, missing="warn")


def _plugins(settings: Settings, configs: Iterable[NetworkConfig]) -> Iterator[Check]:
    for config in configs:
        try:
            types = executed_types(plugin_list(config.raw)[2])
        except ConfigError:
            continue
        missing = sorted(t for t in types if not any(os.path.isfile(os.path.join(d, t)) for d in settings.cni_bin_dirs))
        if missing:
            yield Check(
                "plugins",
                "fail",
                f"{config.name}: {', '.join(missing)} not in {':'.join(settings.cni_bin_dirs)}: its DEL cannot run",
                "mount the bin dir the runtime uses (see --cni-bin-dir)",
            )
        else:
            yield Check("plugins", "ok", f"{config.name}: every plugin of its DEL is here ({', '.join(sorted(types))})")
        for plugin in sorted(types):
            need = DAEMON_SOCKETS.get(plugin) or DAEMON_DIRS.get(plugin)
            if need is not None and not os.path.exists(need[0]):
                yield Check(
                    "plugins",
                    "warn",
                    f"{config.name}: {plugin}'s DEL needs {need[0]}, not here: addresses it holds stay until it runs",
                    f"mount {need[0]} (chart: cniPreset={need[1]})",
                )


def _preset(preset: str | None, configs: Iterable[NetworkConfig]) -> Iterator[Check]:
    """The chart's cniPreset (REAPER_CNI_PRESET) against the plugins the node's configs use."""
    used: set[str] = set()
    for config in configs:
        try:
            used |= executed_types(plugin_list(config.raw)[2])
        except ConfigError:
            continue
    matching = sorted(name for name, types in PRESET_PLUGINS.items() if types & used)
    if preset in (None, ""):
        return
    if preset == "none":
        if matching:
            fix = f"install the chart with --set cniPreset={matching[0]}"
            yield Check("preset", "warn", f"cniPreset none, but the node's configs use {', '.join(matching)}", fix)
        return
    if preset not in PRESET_PLUGINS:
        yield Check("preset", "warn", f"unknown cniPreset {preset!r}", f"one of: none, {', '.join(PRESET_PLUGINS)}")
    elif preset in matching:
        yield Check("preset", "ok", f"cniPreset {preset} matches the node's configs")
    else:
        found = ", ".join(matching) if matching else "none of the presets' plugins"
        fix = f"--set cniPreset={matching[0]}" if matching else "--set cniPreset=none"
        yield Check("preset", "warn", f"cniPreset {preset}, but the node's configs use {found}", fix)


def _pod_cidrs(settings: Settings, configs: Iterable[NetworkConfig]) -> Iterator[Check]:
    """Ranges whose subnet is the node's pod CIDR (Calico, Canal with host-local) need it for
    their gauges and the range-full alert."""
    cidrs = settings.pod_cidrs or PodCidrs(None, None, "")
    for config in configs:
        for version in config.pod_cidr_versions:
            placeholder = "usePodCidr" if version == 4 else "usePodCidrIPv6"
            cidr = cidrs.of_version(version)
            if cidr is not None:
                yield Check("pod CIDR", "ok", f"{config.name}: {placeholder} is {cidr} ({cidrs.source})")
                continue
            problems = (p for p in settings.layout_problems if p.startswith("pod CIDR"))
            why = next(problems, "the node's pod CIDR is unknown")
            fix = "pass --pod-cidr, or run in the chart (REAPER_NODE_NAME and get on nodes)"
            yield Check("pod CIDR", "warn", f"{config.name}: {placeholder} range has no gauge: {why}", fix)


def _namespaces(settings: Settings) -> Iterator[Check]:
    unseen = unseen_processes()
    if unseen is None:
        yield Check("pid namespace", "ok", "every process on the node is visible")
    else:
        fix = "run with the host's PID namespace (hostPID: true) and its /proc"
        yield Check("pid namespace", "fail", f"{unseen}: nothing with a netns can be called an orphan", fix)
    hazard = unpin_hazard(settings.netns_dirs)
    if hazard is None:
        yield Check("mounts", "ok", "netns mounts reach this mount namespace: unpinning is safe")
    else:
        fix = "mount the netns dir with Bidirectional propagation (the chart does) or run in the host's mount namespace"
        yield Check("mounts", "warn", f"{hazard}: no pin will be unlinked", fix)
    yield _held_mounts(settings.netns_dirs)


def _held_mounts(netns_dirs: tuple[str, ...]) -> Check:
    """Whether every mount namespace's mounts can be read, and the namespaces mounts hold
    outside the netns dirs (each keeps its attachment live)."""
    try:
        held = held_elsewhere(netns_mounts(), netns_dirs, own_mount_namespace())
    except OSError as err:
        fix = "run with the host's PID namespace and its /proc, with nsenter on PATH"
        return Check("held netns", "fail", f"the mounts of every mount namespace cannot be read ({err}): "
                     "nothing with a netns can be called an orphan", fix)  # fmt: skip
    if not held:
        return Check("held netns", "ok", "no network namespace is mounted outside the netns dirs")
    first = next(iter(held.values()))[0]
    return Check(
        "held netns", "ok", f"{len(held)} network namespace(s) mounted outside the netns dirs, never reclaimed "
        f"(one: {first.describe()})"
    )  # fmt: skip


def _firewall() -> Iterator[Check]:
    tools = iptables_tools()
    if not tools:
        yield Check("iptables", "warn", "no iptables-save here: CNI chains are not seen", "install iptables")
    for tool in tools:
        try:
            command = [tool.save, "-t", "nat"]
            out = subprocess.run(
                command, capture_output=True, text=True, errors="replace", timeout=SAVE_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            yield Check("iptables", "fail", f"{tool.save}: {err}", "check the iptables install")
            continue
        if out.returncode != 0:
            yield Check("iptables", "warn", f"{tool.save}: {out.stderr.strip()[:200]}")
            continue
        chains = sum(1 for line in out.stdout.splitlines() if line.startswith(":CNI-"))
        yield Check("iptables", "ok", f"{tool.family} {tool.backend}: {chains} CNI chain(s) in nat")
    try:
        tables = present_cni_tables()
    except OSError as err:
        yield Check("nftables", "warn", f"cannot list nft tables: {describe_oserror(err)}")
        return
    detail = ", ".join(f"{family} {name}" for family, name in tables) if tables else "none"
    yield Check("nftables", "ok", f"CNI nft tables: {detail}")


def _runtimes(view: RuntimeView) -> Iterator[Check]:
    if not view.runtimes and not view.reachable:
        yield Check("runtime", "fail", view.error or "no runtime", "pass --runtime-endpoint unix:///path/to/cri.sock")
        return
    for answer in view.runtimes:
        if answer.reachable:
            what = f"{answer.name or '?'} {answer.version or ''}".strip()
            message = f"{answer.endpoint} ({answer.source}): {what}, {answer.sandboxes} sandboxes"
            yield Check("runtime", "ok", message)
        elif answer.skipped:
            yield Check("runtime", "warn", f"{answer.endpoint} ({answer.source}): {answer.error}")
        else:
            fix = "fix or stop that runtime, or pass --runtime-endpoint with the ones that serve pods"
            yield Check("runtime", "fail", f"{answer.endpoint} ({answer.source}): {answer.error}", fix)
    if view.runtimes and not any(a.reachable for a in view.runtimes):
        yield Check("runtime", "fail", "no runtime answers: every pass would be undecided", "pass --runtime-endpoint")


def run_checks(settings: Settings, layout: Layout, view: RuntimeView, preset: str | None = None) -> list[Check]:
    """Every check, in the order a first run needs them. `preset`: the chart's cniPreset."""
    configs, _ = collect_configs_of(settings.cni_conf_dirs)
    return [
        *_runtimes(view),
        *_dirs(settings, layout),
        *_cni_dirs(settings, configs),
        *_plugins(settings, configs),
        *_preset(preset, configs),
        *_pod_cidrs(settings, configs),
        *_namespaces(settings),
        *_firewall(),
    ]


def doctor_json(checks: list[Check]) -> dict[str, Any]:
    return {
        "checks": [{"check": c.name, "status": c.status, "message": c.message, "fix": c.fix} for c in checks],
        "failed": sum(1 for c in checks if c.status == "fail"),
        "warnings": sum(1 for c in checks if c.status == "warn"),
    }


def doctor_table(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        line = f"{c.status:<4}  {c.name:<13} {c.message}"
        if c.fix and c.status != "ok":
            line += f"\n      {'':<13} fix: {c.fix}"
        lines.append(line)
    failed = sum(1 for c in checks if c.status == "fail")
    warned = sum(1 for c in checks if c.status == "warn")
    lines.append(f"\n{failed} failed, {warned} warnings, {len(checks) - failed - warned} ok")
    return "\n".join(lines)
