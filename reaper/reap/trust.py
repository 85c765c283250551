"""Whether a plugin may run for an attachment, and with a cache entry's config. Pure: no I/O.

Files under /var/lib/cni are claims of whoever can write there and never vouch for one another;
a plugin runs only for an attachment a kernel object proves (kernel_proven), and a cache entry's
config (or a delegate file) only when every plugin, path and prevResult in it is what the node's
own conf dir vouches for (cached_config_refusal); otherwise the node's own config runs. Why:
docs/design.md, "Which plugin runs, with which config".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from contextlib import suppress
from typing import Any

from msgspec import Struct

from reaper.cni.result import AddressKey, ResultError, address_keys, fields, go_fold, result_names
from reaper.kinds import flannel, multus
from reaper.kinds.netconf import ConfigError, plugin_list
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import Attachment, Identity, NetworkConfig, NsKey
from reaper.names import is_cni_id

# Keys whose value names a path, a socket or what to execute, folded as Go matches keys. Any
# absolute path or `..` in a string value counts too, whatever its key.
STEERING_KEYS = frozenset(
    go_fold(k)
    for k in (
        "binDir", "binPath", "cniPath", "cniDir", "confDir", "cniConfigDir", "dataDir", "socketDir",
        "socketPath", "daemonSocketPath", "kubeconfig", "logFile", "multusConfigFile", "readinessindicatorfile",
        "runDir", "stateDir", "path", "exec", "command",
    )
)  # fmt: skip
NO_KERNEL_EVIDENCE = (
    "no plugin runs: no netns pin or host veth proves this attachment, only files (which whoever "
    "can write them could have forged); they go as files, its chains and rules by their hash"
)
# Plugins whose DEL reads a per-container file and runs what it names; a per-container file
# naming one would hand root yet another file to read (or the same one, for ever).
DELEGATING_TYPES = frozenset({flannel.PLUGIN, *multus.PLUGINS})


class NodeTrust(Struct, frozen=True, kw_only=True):
    """What the node itself says, to weigh cache entries against."""

    types: frozenset[str]  # plugin and IPAM types the conf dir's configs execute, and --allow-plugin's
    configs: Mapping[str, NetworkConfig]  # the conf dir's config of each network (libcni's first)
    held_ips: frozenset[AddressKey]  # addresses of attachments that are not orphans, by meaning
    held_ifnames: frozenset[str]  # host-side interfaces of attachments that are not orphans
    # Container ID -> the namespaces of its orphaned attachments' real pins (proves its lo, eth1).
    proven: Mapping[str, frozenset[NsKey]] = {}
    # Container ID -> (pod namespace, name) of sandboxes a runtime of this node listed to this
    # process and lists no more (reaper.runtime.listed): proves an ID this node's, for calico.
    gone_here: Mapping[str, tuple[str, str]] = {}


def executed_types(plugins: Iterable[Mapping[str, Any]]) -> set[str]:
    """The plugin types a list executes: each plugin and its IPAM (every spelling of `ipam` and `type` Go takes)."""
    types = set()
    for plugin in plugins:
        types.add(str(plugin.get("type")))
        for ipam in fields(plugin, "ipam"):
            if isinstance(ipam, dict):
                types.update(t for t in fields(ipam, "type") if isinstance(t, str))
    return types


def node_trust(
    conf_configs: Iterable[NetworkConfig],
    allowed: Iterable[str],
    held_ips: Iterable[str],
    held_ifnames: Set[str],
    *,
    proven: Mapping[str, frozenset[NsKey]] | None = None,
    gone_here: Mapping[str, tuple[str, str]] | None = None,
) -> NodeTrust:
    types = set(allowed)
    by_network: dict[str, NetworkConfig] = {}
    for config in conf_configs:
        by_network.setdefault(config.name, config)
        with suppress(ConfigError):
            types |= executed_types(plugin_list(config.raw)[2])
    return NodeTrust(
        types=frozenset(types),
        configs=by_network,
        held_ips=address_keys(held_ips),
        held_ifnames=frozenset(held_ifnames),
        proven=dict(proven or {}),
        gone_here=dict(gone_here or {}),
    )


def proven_namespaces(
    attachments: Sequence[Attachment], records: Mapping[Identity, Any], registry: Registry = REGISTRY
) -> dict[str, frozenset[NsKey]]:
    """Container ID -> the namespaces of the real pins its attachments hold."""
    found: dict[str, set[NsKey]] = {}
    for attachment in attachments:
        cid = attachment.key.container_id
        if cid is None:
            continue
        for ref in attachment.resources:
            pin = registry.pin_of(ref, records)
            if pin is not None:
                found.setdefault(cid, set()).add(pin.ns)
    return {cid: frozenset(namespaces) for cid, namespaces in found.items()}


def kernel_proven(
    attachment: Attachment, records: Mapping[Identity, Any], trust: NodeTrust, registry: Registry = REGISTRY
) -> bool:
    """A kernel object proves the attachment: its pin with a namespace mounted, its host veth
    whose peer is in its namespace, or its namespace is that of a real pin of the same
    container. Files never do."""
    for ref in attachment.resources:
        record, kind = records.get(ref.identity), registry.by_name.get(ref.kind)
        proves = kind.proves if kind is not None else None
        if record is not None and proves is not None and proves(record, attachment.netns):
            return True
    cid = attachment.key.container_id
    return cid is not None and attachment.netns is not None and attachment.netns in trust.proven.get(cid, ())


def _steering(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(place, value) of every string that names a path or steers execution."""
    if isinstance(value, dict):
        for key, item in value.items():
            place = f"{where}.{key}"
            if isinstance(item, str) and (go_fold(str(key)) in STEERING_KEYS or _path_like(item)):
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


def cached_config_refusal(attachment: Attachment, raw: bytes, prev_result: object, trust: NodeTrust) -> str | None:
    """Why a cached config (`raw`, with its result or None) may not run for an attachment the kernel proves, or None."""
    try:
        name, _, plugins = plugin_list(raw)
    except ConfigError as err:
        return f"its config is unreadable: {err}"
    if unknown := sorted(executed_types(plugins) - trust.types):
        return f"it runs plugins no config in the conf dir uses: {', '.join(unknown)[:200]}"
    own = trust.configs.get(name)
    own_plugins = _plugins_by_type(own.raw) if own is not None else {}
    for plugin in plugins:
        if (why := _foreign_steering(plugin, own_plugins)) is not None:
            return why
    return prev_result_refusal(prev_result, trust)


def _foreign_steering(plugin: Mapping[str, Any], own_by_type: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The first path or steering value of `plugin` that the node's plugin of its type lacks."""
    theirs = set(_steering(own_by_type.get(str(plugin.get("type")), {})))
    for place, value in _steering(plugin):
        if (place, value) not in theirs:
            return f"{plugin['type']}{place} = {value[:120]!r} is not what the conf dir's config says"
    return None


def prev_result_refusal(result: object, trust: NodeTrust) -> str | None:
    """Why a prevResult may not reach a plugin: it is no result, or names an address or host veth
    an attachment in use holds (by meaning)."""
    if result is None:
        return None
    try:
        names = result_names(result)
    except ResultError as err:
        return f"its prevResult cannot be read as a result: {err}"
    for text, key in names.addresses:
        if key in trust.held_ips:
            return f"its prevResult names {text[:80]!r}, an address an attachment in use holds"
    for name in names.host_ifnames:
        if name in trust.held_ifnames:
            return f"its prevResult names {name[:80]!r}, a veth an attachment in use holds"
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
    """Why the plugin configs a delegating plugin reads from a per-container file may not run;
    None when they may. The rules of a cached config: `plugins` (keys folded by jsondoc.go_keys,
    each with its network name) against `own`, the node's plugins of that network; `handed`: the
    types the node's delegating config hands out (flannel's bridge, host-local); `prev_results`:
    prevResults besides their own key; `delegating`: the delegating types refused here."""
    allowed = trust.types | handed
    own_by_type = {str(p.get("type")): p for p in own}
    for plugin in plugins:
        types = executed_types([plugin])
        if nested := sorted(types & delegating):
            return f"it names a plugin that runs another per-container file: {', '.join(nested)}"
        if unknown := sorted(types - allowed):
            return f"it runs plugins no config in the conf dir uses: {', '.join(unknown)[:200]}"
        name = plugin.get("name")
        if not (isinstance(name, str) and is_cni_id(name)):
            return f"its network name {str(name)[:80]!r} is not a CNI name"
        if (why := _foreign_steering(plugin, own_by_type)) is not None:
            return why
        if "prevresult" in plugin:
            prev = plugin["prevresult"]
            if not isinstance(prev, dict):
                return "its prevResult is not a result"
            prev_results = [*prev_results, prev]
    return next((why for result in prev_results if (why := prev_result_refusal(result, trust)) is not None), None)
