"""DEL of a whole network list, the way a runtime should have done it.

Unlike libcni, which stops at the first failing plugin (so a chained list whose last plugin
fails keeps leaking the first plugins' resources), every plugin gets its DEL, in reverse
order, and every error is reported.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reaper.inventory.fsutil import UnfitFile, read_file_nofollow
from reaper.names import is_cni_id, is_ifname
from reaper.reclaim.plugin_exec import PluginEnv, PluginFailure, run_plugin

MAX_CACHE_BYTES = 4 << 20
DEFAULT_IFNAME = "eth0"


class DelConfigError(ValueError):
    pass


@dataclass(frozen=True)
class DelRequest:
    container_id: str
    network: str
    ifname: str
    netns: str  # "" when the namespace is gone
    config: bytes  # the network list as loaded (or a single plugin config)
    source: str  # where the config came from: the cache file or the conf file
    cni_args: tuple[tuple[str, str], ...] = (("IgnoreUnknown", "1"),)
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    prev_result: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PluginOutcome:
    plugin: str
    ok: bool
    error: str | None


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return (0,)


def plugin_list(config: bytes) -> tuple[str, str, list[dict[str, Any]]]:
    """(name, cniVersion, plugins) of a network list or single-plugin config."""
    try:
        doc = json.loads(config)
    except (ValueError, UnicodeDecodeError) as err:
        raise DelConfigError(f"config is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise DelConfigError("config is not an object")
    name, version = doc.get("name"), doc.get("cniVersion", "")
    if not isinstance(name, str) or not is_cni_id(name):
        raise DelConfigError("config has no valid name")
    if isinstance(doc.get("plugins"), list):
        plugins = [p for p in doc["plugins"] if isinstance(p, dict)]
    elif isinstance(doc.get("type"), str):
        plugins = [doc]
    else:
        raise DelConfigError("config has no plugins")
    if not all(isinstance(p.get("type"), str) for p in plugins):
        raise DelConfigError("a plugin has no type")
    return name, str(version), plugins


def convert_result(result: Mapping[str, Any], to_version: str) -> dict[str, Any]:
    """A cached result in the list's version, as libcni converts prevResult.

    0.3.x/0.4.0 and 1.x differ only in `ips[].version`; older (0.1/0.2) results are not
    convertible and are not passed on.
    """
    converted = copy.deepcopy(dict(result))
    ips = converted.get("ips")
    if isinstance(ips, list):
        for ip in ips:
            if not isinstance(ip, dict):
                continue
            if _version(to_version) >= (1, 0, 0):
                ip.pop("version", None)
            elif "version" not in ip and isinstance(ip.get("address"), str):
                ip["version"] = "6" if ":" in ip["address"] else "4"
    converted["cniVersion"] = to_version
    return converted


def plugin_stdin(plugin: Mapping[str, Any], name: str, version: str, request: DelRequest) -> dict[str, Any]:
    conf = dict(plugin)
    conf["name"] = name
    conf["cniVersion"] = version
    prev = request.prev_result
    if prev is not None and _version(version) >= (0, 4, 0) and _version(str(prev.get("cniVersion", "0"))) >= (0, 3, 0):
        conf["prevResult"] = convert_result(prev, version)
    capabilities = plugin.get("capabilities")
    if isinstance(capabilities, dict):
        caps = request.capability_args
        runtime = {k: caps[k] for k, on in capabilities.items() if on is True and k in caps}
        if runtime:
            conf["runtimeConfig"] = runtime
    return conf


def del_network(
    request: DelRequest, bin_dirs: tuple[str, ...], timeout: float, stop: threading.Event | None = None
) -> tuple[PluginOutcome, ...]:
    """DEL every plugin of the list, last first, going on past failures (but not past `stop`)."""
    try:
        name, version, plugins = plugin_list(request.config)
    except DelConfigError as err:
        return (PluginOutcome("(config)", False, f"{request.source}: {err}"),)
    env = PluginEnv("DEL", request.container_id, request.netns, request.ifname, request.cni_args, bin_dirs)
    outcomes = []
    for plugin in reversed(plugins):
        plugin_type = str(plugin["type"])
        if stop is not None and stop.is_set():
            outcomes.append(PluginOutcome(plugin_type, False, f"{plugin_type}: not run, stopping"))
            continue
        try:
            run_plugin(plugin_type, plugin_stdin(plugin, name, version, request), env, timeout, stop)
        except PluginFailure as err:
            outcomes.append(PluginOutcome(plugin_type, False, str(err)))
        else:
            outcomes.append(PluginOutcome(plugin_type, True, None))
    return tuple(outcomes)


def request_from_cache(path: str, container_id: str, network: str, ifname: str, netns: str) -> DelRequest | None:
    """A DEL request from a cniCacheV1 entry that still names this attachment; None otherwise."""
    try:
        doc = json.loads(read_file_nofollow(path, MAX_CACHE_BYTES))
    except (OSError, UnfitFile, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") != "cniCacheV1":
        return None
    if (doc.get("containerId"), doc.get("networkName"), doc.get("ifName")) != (container_id, network, ifname):
        return None
    try:
        config = base64.b64decode(str(doc.get("config", "")), validate=True)
    except (binascii.Error, ValueError):
        return None
    if not config:
        return None
    args = []
    for pair in doc.get("cniArgs") or []:
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair):
            key, value = pair
            if key and not any(c in key + value for c in ";=\n\0"):
                args.append((key, value))
    # Plugins refuse CNI_ARGS they do not know unless told to ignore them; runtimes say so, but
    # a cache entry written without it would make every DEL fail.
    if not any(k.lower() == "ignoreunknown" for k, _ in args):
        args.insert(0, ("IgnoreUnknown", "1"))
    caps = doc.get("capabilityArgs")
    result = doc.get("result")
    return DelRequest(
        container_id=container_id,
        network=network,
        ifname=ifname,
        netns=netns,
        config=config,
        source=path,
        cni_args=tuple(args),
        capability_args=caps if isinstance(caps, dict) else {},
        prev_result=result if isinstance(result, dict) else None,
    )


def safe_ifname(ifname: str | None) -> str:
    return ifname if ifname is not None and is_ifname(ifname) else DEFAULT_IFNAME
