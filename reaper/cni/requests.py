"""What a DEL sends each plugin: its stdin and CNI_ARGS, built as libcni builds them."""

from __future__ import annotations

import base64
import binascii
import copy
import re
from collections.abc import Mapping
from typing import Any

from msgspec import Struct, field

from reaper.names import is_ifname

DEFAULT_IFNAME = "eth0"

# Every DEL sends it first, whatever a cache entry says (pkg/types/args.go LoadArgs: "unknown args").
IGNORE_UNKNOWN = ("IgnoreUnknown", "1")
# Bounds of what a cache entry's cniArgs may make CNI_ARGS, so a DEL always executes (the
# kernel's bounds: docs/design.md, "What a DEL sends, and how a result is read").
MAX_ARG_PAIRS = 64
MAX_ARG_KEY = 256  # bytes
MAX_CNI_ARGS = 16 << 10  # bytes of the whole `K=V;K=V` value, IgnoreUnknown=1 included
# A key as plugins look one up: printable ASCII, never the separators.
_ARG_KEY = re.compile(r"[!-:<>-~]+")  # 0x21-0x7e without `;` (0x3b) and `=` (0x3d)


class UnfitArgs(ValueError):
    """A cache entry's cniArgs that cannot be sent as CNI_ARGS; the message is one line."""


def _unfit_value(value: str) -> str | None:
    """Why a value cannot go into CNI_ARGS as it is, or None."""
    if any(c in value for c in ";="):
        return "holds a `;` or `=`, which split CNI_ARGS into other pairs"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "holds a control character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8"
    return None


def cni_args_of(value: object) -> tuple[tuple[str, str], ...]:
    """CNI_ARGS for a DEL from a cache entry's `cniArgs` ([key, value] pairs): IgnoreUnknown=1
    first, then the entry's pairs in order without its own IgnoreUnknown in any case (else
    `ignoreunknown=0` would fail every DEL). UnfitArgs, one line, for what could not be sent as
    the runtime sent it: no DEL runs with other args than the ADD's."""
    if value is None:
        return (IGNORE_UNKNOWN,)
    if not isinstance(value, list):
        raise UnfitArgs("cniArgs is not a list")
    if len(value) > MAX_ARG_PAIRS:
        raise UnfitArgs(f"cniArgs has {len(value)} pairs, more than {MAX_ARG_PAIRS}")
    args = [IGNORE_UNKNOWN]
    for n, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise UnfitArgs(f"cniArgs[{n}] is not a [key, value] pair of strings")
        key, text = pair
        if len(key) > MAX_ARG_KEY:
            raise UnfitArgs(f"cniArgs[{n}] has a key of {len(key)} characters, more than {MAX_ARG_KEY}")
        if not _ARG_KEY.fullmatch(key):
            raise UnfitArgs(f"cniArgs[{n}] has a key {key[:60]!r} that is not printable ASCII without `;` and `=`")
        if (why := _unfit_value(text)) is not None:
            raise UnfitArgs(f"the value of cniArgs[{n}] ({key}) {why}")
        if key.lower() != "ignoreunknown":
            args.append((key, text))
    size = len(";".join(f"{k}={v}" for k, v in args).encode())
    if size > MAX_CNI_ARGS:
        raise UnfitArgs(f"cniArgs make a CNI_ARGS of {size} bytes, more than {MAX_CNI_ARGS}")
    return tuple(args)


class PinnedFile(Struct, frozen=True):
    """A file a delegating plugin reads on DEL, as it was read to be checked."""

    path: str
    stamp: tuple[int, int, int, int, int] | None  # (dev, ino, size, mtime_ns, ctime_ns); None: no file
    data: bytes = b""


class Delegation(Struct, frozen=True):
    """A DEL's plugin that runs what a per-container file names (flannel, multus), with what it
    will read, as checked (reaper.reap.delegates)."""

    index: int  # its place in the list
    plugin_type: str
    file: PinnedFile
    # multus: the other files its DEL reads (its delegates' cached results, a flannel delegate's file)
    results: tuple[PinnedFile, ...] = ()


class DelRequest(Struct, frozen=True, kw_only=True):
    container_id: str
    network: str
    ifname: str
    netns: str  # "" when the namespace is gone
    config: bytes  # the network list as loaded (or a single plugin config)
    source: str  # where the config came from: the cache file or the conf file
    cni_args: tuple[tuple[str, str], ...] = (IGNORE_UNKNOWN,)
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    prev_result: Mapping[str, Any] | None = None
    delegations: tuple[Delegation, ...] = ()  # what its delegating plugins will read, checked
    # CNI_NETNS empty on purpose, as runtimes run DEL once the netns is gone: each stateful
    # plugin frees by container ID (reaper.kinds.netconf.FREES_WITHOUT_NETNS*)
    without_netns: bool = False


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return (0,)


def at_least(version: str, floor: tuple[int, ...]) -> bool:
    return _version(version) >= floor


def convert_result(result: Mapping[str, Any], to_version: str) -> dict[str, Any]:
    """A cached result in the list's version, as libcni converts prevResult: 0.3.x/0.4.0 and 1.x
    differ only in `ips[].version` (0.1/0.2 results are not passed on)."""
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
    """A DEL request from a checked cniCacheV1 entry; None without a config; UnfitArgs (cni_args_of)."""
    try:
        config = base64.b64decode(str(doc.get("config", "")), validate=True)
    except (binascii.Error, ValueError):
        return None
    if not config:
        return None
    caps = doc.get("capabilityArgs")
    result = doc.get("result")
    return DelRequest(
        container_id=container_id,
        network=network,
        ifname=ifname,
        netns=netns,
        config=config,
        source=source,
        cni_args=cni_args_of(doc.get("cniArgs")),
        capability_args=caps if isinstance(caps, dict) else {},
        prev_result=result if isinstance(result, dict) else None,
    )


def safe_ifname(ifname: str | None) -> str:
    return ifname if ifname is not None and is_ifname(ifname) else DEFAULT_IFNAME
