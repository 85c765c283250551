"""What a DEL sends each plugin: its stdin and CNI_ARGS, built as libcni builds them."""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Mapping
from typing import Any

from msgspec import Struct, field

from reaper.names import is_ifname

DEFAULT_IFNAME = "eth0"


class PinnedFile(Struct, frozen=True):
    """A file a delegating plugin reads on DEL, as it was read to be checked."""

    path: str
    stamp: tuple[int, int, int, int, int] | None  # (dev, ino, size, mtime_ns, ctime_ns); None: no file
    data: bytes = b""


class Delegation(Struct, frozen=True):
    """A plugin of a DEL that reads a per-container file and runs what it names (flannel,
    multus), with what it will read, as it was checked (reaper.reap.delegates)."""

    index: int  # its place in the list
    plugin_type: str
    file: PinnedFile
    # multus: the other files its DEL reads (the cached results its delegates get as prevResult,
    # a flannel delegate's own file)
    results: tuple[PinnedFile, ...] = ()


class DelRequest(Struct, frozen=True, kw_only=True):
    container_id: str
    network: str
    ifname: str
    netns: str  # "" when the namespace is gone
    config: bytes  # the network list as loaded (or a single plugin config)
    source: str  # where the config came from: the cache file or the conf file
    cni_args: tuple[tuple[str, str], ...] = (("IgnoreUnknown", "1"),)
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    prev_result: Mapping[str, Any] | None = None
    delegations: tuple[Delegation, ...] = ()  # what its delegating plugins will read, checked


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return (0,)


def at_least(version: str, floor: tuple[int, ...]) -> bool:
    return _version(version) >= floor


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
            if at_least(to_version, (1, 0, 0)):
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
    if prev is not None and at_least(version, (0, 4, 0)) and at_least(str(prev.get("cniVersion", "0")), (0, 3, 0)):
        conf["prevResult"] = convert_result(prev, version)
    capabilities = plugin.get("capabilities")
    if isinstance(capabilities, dict):
        caps = request.capability_args
        runtime = {k: caps[k] for k, on in capabilities.items() if on is True and k in caps}
        if runtime:
            conf["runtimeConfig"] = runtime
    return conf


def request_from_cache(
    doc: Mapping[str, Any], container_id: str, network: str, ifname: str, netns: str, source: str
) -> DelRequest | None:
    """A DEL request from a cniCacheV1 entry (already read and checked to name this
    attachment, by reaper.kinds.cache); None when it carries no config."""
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
        source=source,
        cni_args=tuple(args),
        capability_args=caps if isinstance(caps, dict) else {},
        prev_result=result if isinstance(result, dict) else None,
    )


def safe_ifname(ifname: str | None) -> str:
    return ifname if ifname is not None and is_ifname(ifname) else DEFAULT_IFNAME
