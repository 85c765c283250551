"""Whether a plugin may run for an attachment, and with a cache entry's config. Pure: no I/O.

Everything under /var/lib/cni (cache entries, host-local leases, flannel's, multus' and
tuning's files) is written by whoever can write that dir, so what each says is a claim, and
files there never vouch for one another: a forged lease beside a forged cache entry proves
nothing. What such a writer cannot make is a kernel object. So a plugin (DEL, or GC) runs for an
attachment only when the kernel proves it: a pin of it with a namespace mounted on it, a host
veth of it whose peer lives in its namespace, or (for a container's second attachment, its lo
or another network) its namespace being that of such a pin of the same container. An
attachment made only of files gets no plugin: its files go as files (leases under host-local's
lock), its chains and rules by their hash, and a cache entry whose IPAM keeps the address off
the node stays, reported (only that plugin's DEL could free it). One exception, as runtimes run
DEL once the netns is gone: an attachment in no namespace at all whose every stateful plugin
frees by container ID (cilium-cni: reaper.kinds.netconf.FREES_WITHOUT_NETNS; calico only for a
sandbox a runtime of this node listed to this process and lists no more, NodeTrust.gone_here)
gets its DEL with an empty CNI_NETNS, with its cache entry's config only when that passes the
rules below, never the conf dir's in its place (reaper.reap.requests.without_netns_request).

A proven attachment's cache entry config runs for DEL only when every plugin it would execute
is one the node's own conf dir uses (or the operator allowed); every path or execution-steering
value in it is the one the conf dir's config of that network holds; and its prevResult reads as
a result and names no address or host interface that an attachment still in use holds (plugins
such as `firewall` delete by what prevResult says), compared by meaning (reaper.cni.result).
Otherwise the node's own config runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
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
# Plugins whose DEL reads a per-container file and runs what it names. A per-container file
# naming one of them would hand root yet another file to read (or the same one, for ever).
DELEGATING_TYPES = frozenset({flannel.PLUGIN, *multus.PLUGINS})


class NodeTrust(Struct, frozen=True, kw_only=True):
    """What the node itself says, to weigh cache entries against."""

    types: frozenset[str]  # plugin and IPAM types the conf dir's configs execute, and --allow-plugin's
    configs: Mapping[str, NetworkConfig]  # the conf dir's config of each network (libcni's first)
    held_ips: frozenset[AddressKey]  # addresses of attachments that are not orphans, by meaning
    held_ifnames: frozenset[str]  # host-side interfaces of attachments that are not orphans
    # Container ID -> the namespaces of its orphaned attachments' real pins: what the kernel
    # proves of a container, for its attachments that hold no pin themselves (its lo, eth1).
    proven: Mapping[str, frozenset[NsKey]] = {}
    # Container ID -> (pod namespace, name) of sandboxes a runtime of this node listed to this
    # process and no runtime lists now (reaper.runtime.listed): what proves an ID was this
    # node's, for plugins that free by it in the cluster's datastore (calico).
    gone_here: Mapping[str, tuple[str, str]] = {}


def executed_types(plugins: Iterable[Mapping[str, Any]]) -> set[str]:
    """The plugin types a list executes: each plugin and its IPAM plugin (every spelling of the
    `ipam` and `type` keys the plugin's Go decoder would take)."""
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
        try:
            types |= executed_types(plugin_list(config.raw)[2])
        except ConfigError:
            continue
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
    """A kernel object proves the attachment: a pin of it with a namespace mounted on it, a host
    veth of it whose peer lives in its namespace, or its namespace is one a real pin of the
    same container holds. Files (cache entries, leases, flannel's, multus', tuning's) never do."""
    for ref in attachment.resources:
        record, kind = records.get(ref.identity), registry.by_name.get(ref.kind)
        if (
            record is not None
            and kind is not None
            and kind.proves is not None
            and kind.proves(record, attachment.netns)
        ):
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
    """Why a cache entry's config (`raw`, with the entry's `result`, None when it has none) may
    not run for an attachment the kernel proves; None when it may."""
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
    return prev_result_refusal(prev_result, trust)


def prev_result_refusal(result: object, trust: NodeTrust) -> str | None:
    """Why a prevResult may not reach a plugin: it does not read as a result, or it names an
    address or a host veth an attachment in use holds (by meaning, whatever its spelling)."""
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
        refusal = prev_result_refusal(result, trust)
        if refusal is not None:
            return refusal
    return None
