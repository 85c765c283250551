"""Whether a cache entry's config may run as root. Pure: no I/O.

A cache file is written by whoever can write the cache dir, so what it says is a claim. Its
config runs for DEL only when the node corroborates it: something else found on the node
independently of the file belongs to the same attachment; every plugin it would execute is one
the node's own conf dir uses (or the operator allowed); every path or execution-steering value
in it is the one the conf dir's config of that network holds; and its prevResult names no
address or host interface that an attachment still in use holds (plugins such as `firewall`
delete by what prevResult says). Otherwise the node's own config runs, or nothing does and the
file is removed as a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from typing import Any

from msgspec import Struct

from reaper.kinds.netconf import ConfigError, plugin_list
from reaper.model import Attachment, NetworkConfig
from reaper.names import is_cni_id

# Keys whose value names a path, a socket or what to execute. Any absolute path or `..` in a
# string value counts too, whatever its key.
STEERING_KEYS = frozenset(
    k.lower()
    for k in (
        "binDir", "binPath", "cniPath", "cniDir", "confDir", "cniConfigDir", "dataDir", "socketDir",
        "socketPath", "daemonSocketPath", "kubeconfig", "logFile", "multusConfigFile", "readinessindicatorfile",
        "runDir", "stateDir", "path", "exec", "command",
    )
)  # fmt: skip
# Files in the cache dir beside the cache entry, or in /run/cni: whoever can forge the one can
# forge these.
SAME_WRITER_KINDS = frozenset({"cache", "flannel", "multus", "tuning"})
# Plugins whose DEL reads a per-container file and runs what it names. A per-container file
# naming one of them would hand root yet another file to read (or the same one, for ever).
DELEGATING_TYPES = frozenset({"flannel", "multus", "multus-shim"})


class NodeTrust(Struct, frozen=True):
    """What the node itself says, to weigh cache entries against."""

    types: frozenset[str]  # plugin and IPAM types the conf dir's configs execute, and --allow-plugin's
    configs: Mapping[str, NetworkConfig]  # the conf dir's config of each network (libcni's first)
    held_ips: frozenset[str]  # addresses of attachments that are not orphans
    held_ifnames: frozenset[str]  # host-side interfaces of attachments that are not orphans


def executed_types(plugins: Iterable[Mapping[str, Any]]) -> set[str]:
    """The plugin types a list executes: each plugin and its IPAM plugin."""
    types = set()
    for plugin in plugins:
        types.add(str(plugin.get("type")))
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and isinstance(ipam.get("type"), str):
            types.add(ipam["type"])
    return types


def node_trust(
    conf_configs: Iterable[NetworkConfig], allowed: Iterable[str], held_ips: Set[str], held_ifnames: Set[str]
) -> NodeTrust:
    types = set(allowed)
    by_network: dict[str, NetworkConfig] = {}
    for config in conf_configs:
        by_network.setdefault(config.name, config)
        try:
            types |= executed_types(plugin_list(config.raw)[2])
        except ConfigError:
            continue
    return NodeTrust(frozenset(types), by_network, frozenset(held_ips), frozenset(held_ifnames))


def _steering(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(place, value) of every string that names a path or steers execution."""
    if isinstance(value, dict):
        for key, item in value.items():
            place = f"{where}.{key}"
            if isinstance(item, str) and (str(key).lower() in STEERING_KEYS or _path_like(item)):
                yield place, item
            else:
                yield from _steering(item, place)
    elif isinstance(value, list):
        for n, item in enumerate(value):
            if isinstance(item, str) and _path_like(item):
                yield f"{where}[{n}]", item
            else:
                yield from _steering(item, f"{where}[{n}]")


def _path_like(text: str) -> bool:
    return text.startswith("/") or "../" in text or text.startswith("~")


def _plugins_by_type(raw: bytes) -> dict[str, Mapping[str, Any]]:
    try:
        return {str(p["type"]): p for p in plugin_list(raw)[2]}
    except ConfigError:
        return {}


def corroborated(attachment: Attachment) -> bool:
    """Something found independently of the cache file (and not written beside it) belongs to
    this attachment."""
    return any(ref.kind not in SAME_WRITER_KINDS for ref in attachment.resources)


def cached_config_refusal(
    attachment: Attachment, raw: bytes, prev_result: Mapping[str, Any] | None, trust: NodeTrust
) -> str | None:
    """Why a cache entry's config (`raw`, with `prev_result`) may not run; None when it may."""
    if not corroborated(attachment):
        return "nothing on the node but the cache file names this attachment"
    try:
        name, _, plugins = plugin_list(raw)
    except ConfigError as err:
        return f"its config is unreadable: {err}"
    unknown = sorted(executed_types(plugins) - trust.types)
    if unknown:
        return f"it runs plugins no config in the conf dir uses: {', '.join(unknown)[:200]}"
    own = trust.configs.get(name)
    own_plugins = _plugins_by_type(own.raw) if own is not None else {}
    for plugin in plugins:
        theirs = set(_steering(own_plugins.get(str(plugin["type"]), {})))
        for place, value in _steering(plugin):
            if (place, value) not in theirs:
                return f"{plugin['type']}{place} = {value[:120]!r} is not what the conf dir's config says"
    held = _held(prev_result, trust)
    if held is not None:
        return f"its prevResult names {held}, which an attachment in use holds"
    return None


def _held(result: Mapping[str, Any] | None, trust: NodeTrust) -> str | None:
    if result is None:
        return None
    for ip in result.get("ips") or ():
        address = ip.get("address") if isinstance(ip, dict) else None
        if isinstance(address, str) and address.split("/")[0] in trust.held_ips:
            return address.split("/")[0]
    for iface in result.get("interfaces") or ():
        if isinstance(iface, dict) and not iface.get("sandbox") and iface.get("name") in trust.held_ifnames:
            return str(iface["name"])
    return None


def delegate_file_refusal(
    plugins: Sequence[Mapping[str, Any]],
    own: Sequence[Mapping[str, Any]],
    trust: NodeTrust,
    *,
    handed: Set[str] = frozenset(),
    prev_results: Iterable[Mapping[str, Any]] = (),
    delegating: Set[str] = DELEGATING_TYPES,
) -> str | None:
    """Why the plugin configs a delegating plugin (flannel, multus) reads from a per-container
    file may not run as root; None when they may. The rules of a cached config, file by file:
    `plugins` are what the delegating plugin will run, keys folded by
    reaper.host.jsondoc.go_keys, each with the network name it will be given; `own` the node's
    own plugins of that network (folded too), the only place a path or execution-steering
    value may come from; `handed` the plugin types the node's delegating config itself hands
    its delegates (flannel's bridge and host-local); `prev_results` what the plugins will be
    given as prevResult besides their own key; `delegating` the delegating types refused here
    (a caller that checks the file such a plugin reads may let it through)."""
    allowed = trust.types | handed
    own_by_type = {str(p.get("type")): p for p in own}
    for plugin in plugins:
        types = executed_types([plugin])
        nested = sorted(types & delegating)
        if nested:
            return f"it names a plugin that runs another per-container file: {', '.join(nested)}"
        unknown = sorted(types - allowed)
        if unknown:
            return f"it runs plugins no config in the conf dir uses: {', '.join(unknown)[:200]}"
        name = plugin.get("name")
        if not (isinstance(name, str) and is_cni_id(name)):
            return f"its network name {str(name)[:80]!r} is not a CNI name"
        theirs = set(_steering(own_by_type.get(str(plugin.get("type")), {})))
        for place, value in _steering(plugin):
            if (place, value) not in theirs:
                return f"{plugin['type']}{place} = {value[:120]!r} is not what the conf dir's config says"
        if "prevresult" in plugin:
            prev = plugin["prevresult"]
            if not isinstance(prev, dict):
                return "its prevResult is not a result"
            prev_results = [*prev_results, prev]
    for result in prev_results:
        try:
            held = _held(result, trust)
        except (TypeError, AttributeError, ValueError):  # a shape no result has: one refusal
            return "its prevResult is not a result"
        if held is not None:
            return f"its prevResult names {held}, which an attachment in use holds"
    return None
