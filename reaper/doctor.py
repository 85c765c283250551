"""`reaper doctor`: everything an operator must know before trusting the reaper on a node, one
line a check, `ok`, `warn` or `fail` with the fix. A `fail` is what would leave the reaper blind
(it would see leaks that are not, or none at all) or unable to reclaim safely."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from msgspec import Struct

from reaper.cni.invoke import PLUGIN_PATH
from reaper.host.files import describe_oserror
from reaper.host.iptables_backend import PathPlan, plan_plugin_path
from reaper.host.mounts import unpin_hazard
from reaper.host.nsmounts import held_mounts
from reaper.host.procs import unseen_processes
from reaper.kinds import flannel, multus
from reaper.kinds.iptables import iptables_tools
from reaper.kinds.netconf import ConfigError, collect_configs_of, plugin_list
from reaper.kinds.nftables import present_cni_tables
from reaper.kinds.scratch import go_join
from reaper.layout import Layout
from reaper.model import NetworkConfig, RuntimeView
from reaper.podcidr import PodCidrs
from reaper.reap.trust import executed_types
from reaper.runtime.cause import likely_cause, refused
from reaper.runtime.discovery import KNOWN_SOCKETS, open_socket
from reaper.settings import Settings

Status = Literal["ok", "warn", "fail"]

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

# The root the host's init sees: in the chart's pod (host PID namespace) the node's own files,
# whatever the pod mounts; on the host itself, this process' root.
HOST_ROOT = "/proc/1/root"
# Paths only one platform preset of the chart mounts (charts/cni-reaper/templates/_platforms.tpl):
# a dir under one of them that is not visible here is fixed by that preset, if it is not the one
# the pod was given (REAPER_PLATFORM).
PLATFORM_PATHS: tuple[tuple[str, str], ...] = (
    ("/run/cni-ipam-state", "kind"),
    ("/var/lib/rancher/k3s", "k3s"),
    ("/run/k3s", "k3s or rke2"),
    ("/var/snap/microk8s", "microk8s"),
    ("/etc/kubernetes/cni/net.d", "openshift"),
    ("/var/lib/cni/bin", "openshift"),
    ("/run/multus", "openshift"),
    ("/var/run/multus", "openshift"),
    ("/run/ovn-kubernetes", "openshift"),
    ("/var/run/ovn-kubernetes", "openshift"),
    ("/run/crio", "openshift or kubeadm"),
    ("/var/run/crio", "openshift or kubeadm"),
    ("/home/kubernetes/bin", "gke"),
)


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
    find = settings.find
    for flag, dirs in (
        ("--cni-conf-dir", find.conf_dirs),
        ("--cni-bin-dir", find.bin_dirs),
        ("--netns-dir", find.netns_dirs),
        ("--namespaces-dir", find.namespaces_dirs),
    ):
        if dirs:
            yield Check("layout", "ok", f"{flag} {':'.join(dirs)} (from {origins.get(flag, 'default')})")


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
    conf = [_readable("conf dir", d, mount) for d in settings.find.conf_dirs]
    yield from conf
    if any(c.status == "ok" for c in conf):
        if configs:
            names = ", ".join(sorted({c.name for c in configs}))
            yield Check("conf dir", "ok", f"{len(configs)} network config(s): {names}")
        else:
            yield Check("conf dir", "warn", f"no network config in {':'.join(settings.find.conf_dirs)}", mount)
    yield from (_readable("bin dir", d, mount) for d in settings.find.bin_dirs)
    yield _readable("cache dir", settings.find.cache_dir, mount, missing="warn")
    # namespaces dirs: CRI-O's pins of a sandbox's other namespaces, freed with its netns pin.
    for name, dirs in (
        ("netns dir", settings.find.netns_dirs),
        ("ipam dir", settings.find.ipam_dirs),
        ("namespaces dir", settings.find.namespaces_dirs),
    ):
        yield from (_readable(name, d, mount, missing="warn") for d in dirs)


def _nodename_dirs(plugins: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Calico's datastore dir where a config moves it: the dir of its `nodename_file` (microk8s
    keeps it under /var/snap), by plugin type."""
    found: dict[str, str] = {}
    for plugin in plugins:
        kind, named = plugin.get("type"), plugin.get("nodename_file")
        if isinstance(kind, str) and kind in DAEMON_DIRS and isinstance(named, str) and named.startswith("/"):
            found.setdefault(kind, os.path.dirname(go_join(named, "")))
    return found


def _plugin_lists(configs: Iterable[NetworkConfig]) -> Iterator[tuple[NetworkConfig, list[dict[str, Any]], set[str]]]:
    """Each readable config with its plugin list and the plugin types its DEL runs."""
    for config in configs:
        try:
            plugins = plugin_list(config.raw)[2]
            yield config, plugins, executed_types(plugins)
        except ConfigError:
            continue


def _plugins(settings: Settings, configs: Iterable[NetworkConfig], platform: str | None = None) -> Iterator[Check]:
    bin_dirs = settings.find.bin_dirs
    for config, plugins, types in _plugin_lists(configs):
        missing = sorted(t for t in types if not any(os.path.isfile(os.path.join(d, t)) for d in bin_dirs))
        if missing:
            message = f"{config.name}: {', '.join(missing)} not in {':'.join(bin_dirs)}: its DEL cannot run"
            yield Check("plugins", "fail", message, "mount the bin dir the runtime uses (see --cni-bin-dir)")
        else:
            yield Check("plugins", "ok", f"{config.name}: every plugin of its DEL is here ({', '.join(sorted(types))})")
        moved = _nodename_dirs(plugins)
        for plugin in sorted(types):
            need = DAEMON_SOCKETS.get(plugin) or DAEMON_DIRS.get(plugin)
            if need is None:
                continue
            path = moved.get(plugin, need[0])
            if os.path.exists(path):
                continue
            # The preset mounts the CNI's usual path; one the config moved is the platform's.
            fix = f"mount {path} (chart: cniPreset={need[1]})"
            if path != need[0]:
                fix = _chart_fix(path, "extraHostPaths", platform)
            message = f"{config.name}: {plugin}'s DEL needs {path}, not here: addresses it holds stay until it runs"
            yield Check("plugins", "warn", message, fix)


def _gc_disabled(configs: Iterable[NetworkConfig]) -> Iterator[Check]:
    """A warning naming the networks whose config says `disableGC: true`: their leaks are never
    reclaimed (reaper.reconcile.gc_disabled_networks), which an operator should know first."""
    kept = [f"{c.name} ({c.path})" for c in configs if c.disable_gc]
    if kept:
        yield Check(
            "disableGC",
            "warn",
            f"{', '.join(kept)}: its config says disableGC, so its attachments are excluded, never "
            "reclaimed, even with --force",
            "nothing, if another runtime shares the config; else drop disableGC from it to let its leaks be reclaimed",
        )


def _preset(preset: str | None, configs: Iterable[NetworkConfig]) -> Iterator[Check]:
    """The chart's cniPreset (REAPER_CNI_PRESET) against the plugins the node's configs use."""
    if preset in (None, ""):
        return
    used = set().union(*(types for _, _, types in _plugin_lists(configs)))
    matching = sorted(name for name, types in PRESET_PLUGINS.items() if types & used)
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


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _chart_fix(path: str, value: str, platform: str | None) -> str:
    """The chart values that make `path` visible: `value`, and the platform preset that mounts
    it when the pod was given another."""
    fix = f"chart: add {path} to {value}"
    names = next((names for prefix, names in PLATFORM_PATHS if _under(path, prefix)), None)
    if names is not None and (platform or "") not in names.split(" or "):
        fix += f", or set platform={names.replace(' or ', ' or platform=')}"
    return fix


def _state_dirs(settings: Settings, configs: Iterable[NetworkConfig]) -> Iterator[tuple[str, str, str]]:
    """(what, dir, network) of each dir a config has a plugin keep state in: host-local's
    dataDir, flannel's dataDir and multus' cniDir (their defaults under the cache dir when the
    config names none), as the plugins resolve them."""
    for config in configs:
        yield from (("ipam dataDir", data_dir, config.name) for data_dir in config.ipam_data_dirs)
        try:
            plugins = plugin_list(config.raw)[2]
        except ConfigError:
            continue
        for plugin in plugins:
            kind = plugin.get("type")
            if kind == flannel.PLUGIN:
                key, default = "dataDir", flannel.DEFAULT_SUBDIR
            elif kind in multus.PLUGINS:
                key, default = "cniDir", multus.DEFAULT_SUBDIR
            else:
                continue
            named = plugin.get(key)
            if isinstance(named, str) and named.startswith("/"):
                yield f"{kind} {key}", go_join(named, ""), config.name
            elif named is None:
                yield f"{kind} {key}", os.path.join(settings.find.cache_dir, default), config.name


def _socket_key(path: str, root: str | None) -> tuple[int, int] | None:
    """The (device, inode) of the socket at `path` (in `root`), None when there is none."""
    opened = open_socket(path, root)
    if opened is None:
        return None
    os.close(opened[0])
    return opened[1]


def _same_dir(first: str, second: str) -> bool:
    """Whether both paths are one directory; False when either cannot be looked at (then a dir
    missing here may be one the host has)."""
    try:
        a, b = os.stat(first), os.stat(second)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _twin(path: str) -> str:
    """The same path under the other spelling of /run (/var/run links to /run on every
    distribution the chart's platforms run)."""
    if path.startswith("/var/run/"):
        return path[len("/var") :]
    return "/var" + path if path.startswith("/run/") else path


def _visibility(
    settings: Settings,
    configs: Iterable[NetworkConfig],
    platform: str | None,
    *,
    host_root: str = HOST_ROOT,
    here_root: str | None = None,
    known: tuple[tuple[str, str], ...] = KNOWN_SOCKETS,
) -> Iterator[Check]:
    """One warning, with the chart value that mounts it, for each IPAM dataDir, plugin state dir or
    runtime socket the node has that this process does not see (docs/design.md, "What doctor's
    visibility check warns of"). `here_root`: where this process' paths are looked up (None: /)."""

    def here(path: str) -> str:
        return path if here_root is None else os.path.join(here_root, path.lstrip("/"))

    # On the host itself a dir missing here is missing, not hidden: the plugin has not made it yet.
    hidden = not _same_dir(host_root, here("/"))
    mounted = [d for d in (settings.find.cache_dir, *settings.find.ipam_dirs) if os.path.isdir(here(d))]
    warned = 0
    seen: set[str] = set()
    for what, directory, network in _state_dirs(settings, configs):
        if directory in seen or directory in settings.find.ipam_dirs:  # the ipam dir check has those
            continue
        seen.add(directory)
        if not hidden or os.path.isdir(here(directory)) or any(_under(directory, d) for d in mounted):
            continue
        warned += 1
        value = "ipamDirs or extraHostPaths" if what == "ipam dataDir" else "extraHostPaths"
        message = f"{what} {directory} of network {network} is not visible here: what it holds is not seen"
        yield Check("visibility", "warn", message, _chart_fix(directory, value, platform))
    on_host: set[tuple[int, int]] = set()
    for name, path in known:
        key = _socket_key(path, host_root)
        if key is None or key in on_host:
            continue  # none there, or one socket under both spellings of /run: the first stays
        on_host.add(key)
        if any(_socket_key(here(p), None) is not None for p in (path, _twin(path))):
            continue
        warned += 1
        pinned = " (only --runtime-endpoint is asked: leave it unset)" if settings.runtime_endpoints else ""
        message = f"runtime socket {path} ({name}) is on the host but not visible here: that runtime is not asked"
        yield Check(
            "visibility", "warn", message + pinned, _chart_fix(os.path.dirname(path), "runtimeSocketDirs", platform)
        )
    if not warned:
        yield Check("visibility", "ok", "every IPAM, plugin state dir and runtime socket of the node is visible here")


def _pod_cidrs(settings: Settings, configs: Iterable[NetworkConfig]) -> Iterator[Check]:
    """Ranges whose subnet is the node's pod CIDR (Calico, Canal with host-local) need it for
    their gauges and the range-full alert."""
    cidrs = settings.find.pod_cidrs or PodCidrs(None, None, "")
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
    hazard = unpin_hazard(settings.find.netns_dirs)
    if hazard is None:
        yield Check("mounts", "ok", "netns mounts reach this mount namespace: unpinning is safe")
    else:
        fix = "mount the netns dir with Bidirectional propagation (the chart does) or run in the host's mount namespace"
        yield Check("mounts", "warn", f"{hazard}: no pin will be unlinked", fix)
    yield _held_mounts(settings.find.netns_dirs)


def _held_mounts(netns_dirs: tuple[str, ...]) -> Check:
    """Whether every mount namespace's mounts can be read, and the namespaces mounts hold
    outside the netns dirs (each keeps its attachment live)."""
    try:
        held = held_mounts(netns_dirs).held
    except OSError as err:
        fix = (
            "run with the host's PID namespace and its /proc, and CAP_SYS_ADMIN and CAP_SYS_CHROOT to join a mount"
            " namespace pinned with no process in it"
        )
        return Check("held netns", "fail", f"the mounts of every mount namespace cannot be read ({err}): "
                     "nothing with a netns can be called an orphan", fix)  # fmt: skip
    if not held:
        return Check("held netns", "ok", "no network namespace is mounted outside the netns dirs")
    first = next(iter(held.values()))[0]
    return Check(
        "held netns", "ok", f"{len(held)} network namespace(s) mounted outside the netns dirs, never reclaimed "
        f"(one: {first.describe()})"
    )  # fmt: skip


def plugin_iptables(plan: PathPlan) -> Check:
    """Which iptables backend plugin DELs would run here (reaper.host.iptables_backend)."""
    if plan.problem is not None:
        fix = "install both iptables backends (iptables-legacy, iptables-nft) where the reaper runs"
        return Check("iptables", "warn", plan.describe(), fix)
    return Check("iptables", "ok", plan.describe())


def _firewall() -> Iterator[Check]:
    yield plugin_iptables(plan_plugin_path(PLUGIN_PATH))
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


def _runtimes(view: RuntimeView, layout: Layout) -> Iterator[Check]:
    if not view.runtimes and not view.reachable:
        # The likely cause (a runtime configured here whose socket is silent, or none at all),
        # not a flag to pass: the flag only helps once the runtime serves somewhere.
        yield Check("runtime", "fail", view.error or "no runtime", likely_cause(view, layout))
        return
    for answer in view.runtimes:
        if answer.reachable:
            what = f"{answer.name or '?'} {answer.version or ''}".strip()
            message = f"{answer.endpoint} ({answer.source}): {what}, {answer.sandboxes} sandboxes"
            yield Check("runtime", "ok", message)
        elif answer.skipped:
            yield Check("runtime", "warn", f"{answer.endpoint} ({answer.source}): {answer.error}")
        else:
            # A runtime that is there and could not be asked stops every pass: restarted or
            # fixed, or, by the operator who knows it is gone, left out by naming the others.
            if refused(answer):
                fix = "start it again; if it is gone for good, pass --runtime-endpoint with the ones that serve pods"
            else:
                fix = "fix or stop that runtime, or pass --runtime-endpoint with the ones that serve pods"
            yield Check("runtime", "fail", f"{answer.endpoint} ({answer.source}): {answer.error}", fix)
    if view.runtimes and not any(a.reachable for a in view.runtimes):
        cause = likely_cause(view, layout)
        if any(a.error and a.error in cause for a in view.runtimes):
            # The cause is the runtimes' own words, each already a line above with its fix.
            cause = "make a runtime above answer (see its fix), or pass --runtime-endpoint with those that serve pods"
        yield Check("runtime", "fail", "no runtime answers: every pass would be undecided", cause)


def run_checks(
    settings: Settings, layout: Layout, view: RuntimeView, preset: str | None = None, platform: str | None = None
) -> list[Check]:
    """Every check, in the order a first run needs them; `preset`, `platform`: the chart's cniPreset and platform."""
    configs, _ = collect_configs_of(settings.find.conf_dirs)
    return [
        *_runtimes(view, layout),
        *_dirs(settings, layout),
        *_cni_dirs(settings, configs),
        *_visibility(settings, configs, platform),
        *_plugins(settings, configs, platform),
        *_gc_disabled(configs),
        *_preset(preset, configs),
        *_pod_cidrs(settings, configs),
        *_namespaces(settings),
        *_firewall(),
    ]


def _count(checks: list[Check], status: Status) -> int:
    return sum(1 for c in checks if c.status == status)


def doctor_json(checks: list[Check]) -> dict[str, Any]:
    return {
        "checks": [{"check": c.name, "status": c.status, "message": c.message, "fix": c.fix} for c in checks],
        "failed": _count(checks, "fail"),
        "warnings": _count(checks, "warn"),
    }


def doctor_table(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        fix = f"\n      {'':<13} fix: {c.fix}" if c.fix and c.status != "ok" else ""
        lines.append(f"{c.status:<4}  {c.name:<13} {c.message}{fix}")
    failed, warned = _count(checks, "fail"), _count(checks, "warn")
    lines.append(f"\n{failed} failed, {warned} warnings, {len(checks) - failed - warned} ok")
    return "\n".join(lines)
