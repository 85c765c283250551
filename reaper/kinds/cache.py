"""libcni's result cache: `<cache dir>/results/<network>-<container ID>-<ifname>`.

Identity: the path; tie: libcni's key in the content. One reader (`parse_cache_file`) serves the
look, the DEL request and the compare before the file is removed, last of its attachment. The
other dirs it is read in (RESULT_SUBDIRS, multus' cniDirs): docs/design.md, "In depth: the kinds".
"""

from __future__ import annotations

import base64
import binascii
import heapq
import ipaddress
import os
import re
from collections.abc import Sequence, Set
from sys import intern
from typing import Any, NamedTuple

from msgspec import Struct

from reaper.cni.result import fields
from reaper.host.confined import UnfitFile, read_at, read_beneath
from reaper.host.files import DirLister, describe_oserror
from reaper.host.jsondoc import NotAnObject, parse_object
from reaper.host.memo import FileMemo
from reaper.host.netns_paths import NetnsPlaces, shown
from reaper.host.quarantine import remove_or_quarantine
from reaper.kinds import Found, Kind, Look, ReclaimContext, multus, optional
from reaper.kinds.netconf import ConfigError, parse_network_config, plugin_list
from reaper.model import CorruptFile, DetailValue, Done, Identity, NetworkConfig, NsKey, Owner, OwnKey, ResourceRef
from reaper.names import is_cni_id, is_ifname, is_path

MAX_CACHE_BYTES = 4 << 20
# Costless entries a look holds, the oldest; more are counted and read next pass (multus#1488:
# 300,000 files would pass the agent's memory limit). docs/design.md, "What `--max-reap` bounds".
COSTLESS_HELD = 20_000
RESULT_SUBDIRS = ("results", "cache/results", "multus/results")
_HEX_ID = re.compile(r"[0-9a-f]{64}")


class CacheEntry(Struct, frozen=True, kw_only=True, gc=False):
    path: str
    name: str
    container_id: str
    network: str
    ifname: str
    netns_path: str | None
    netns: NsKey | None
    host_ifnames: tuple[str, ...]
    legacy: bool  # a bare pre-0.8 result with no `kind`
    mtime: float
    cache_dir: str  # the root it was found beneath, and every later access is confined to
    # Why the file could not be read, when its name alone ties it (a crash's empty file: DEL fails).
    corrupt: str | None = None
    netns_uninspectable: bool = False  # its netns path exists but cannot be inspected
    netns_refused: str | None = None  # why its netns path is no place a netns can be (tied by ID)
    owner: Owner = "unknown"  # "cri" (K8S_POD_NAMESPACE in its CNI_ARGS), "other", or "unknown"
    ips: tuple[str, ...] = ()  # the addresses its result holds
    # The pod its CNI_ARGS name, when both read as Kubernetes names: said by a file, never proof.
    pod_namespace: str | None = None
    pod_name: str | None = None
    loopback_only: bool = False  # ADDed a loopback's config alone, and its result is one (costless)


class CacheInventory(Struct, frozen=True):
    entries: tuple[CacheEntry, ...]
    configs: tuple[NetworkConfig, ...]  # the network configs cache entries carry
    corrupt: tuple[CorruptFile, ...]


class CacheCorrupt(ValueError):
    """A cache file that is not one libcni wrote (or was cut short while it did)."""


class CacheDocument(NamedTuple):
    doc: dict[str, Any]  # the whole cniCacheV1 object; a legacy result sits under "result"
    container_id: str
    network: str
    ifname: str
    legacy: bool  # a bare pre-0.8 result with no `kind`: its file name is its only identity


def _result_interfaces(result: Any) -> list[dict[str, Any]]:
    if not isinstance(result, dict) or not isinstance(result.get("interfaces"), list):
        return []
    return [i for i in result["interfaces"] if isinstance(i, dict)]


def _netns_from(doc: dict[str, Any], result: Any, ifname: str) -> str | None:
    netns = doc.get("netns")
    if isinstance(netns, str) and netns:
        return netns
    sandboxes = [
        i
        for i in _result_interfaces(result)
        if isinstance(i.get("sandbox"), str) and i["sandbox"] and is_path(i["sandbox"])
    ]
    sandboxes.sort(key=lambda i: i.get("name") != ifname)  # the one named `ifname` first
    return str(sandboxes[0]["sandbox"]) if sandboxes else None


def _addresses(result: Any) -> tuple[str, ...]:
    ips = result.get("ips") if isinstance(result, dict) else None
    if not isinstance(ips, list):
        return ()
    found = (ip.get("address") for ip in ips if isinstance(ip, dict))
    return tuple(a.split("/")[0] for a in found if isinstance(a, str) and len(a) < 64)


def _host_ifnames(result: Any) -> tuple[str, ...]:
    names = (i.get("name") for i in _result_interfaces(result) if not i.get("sandbox"))
    return tuple(name for name in names if isinstance(name, str) and is_ifname(name))


LOOPBACK_PLUGIN = "loopback"
LOOPBACK_IFNAME = "lo"


def _loopback_result(result: Any) -> bool:
    """Whether a result is the loopback plugin's and nothing more (plugins/main/loopback/loopback.go):
    every interface `lo` in the sandbox, every address a loopback one, keys read as Go's decoder
    takes them; an address that does not parse is not loopback."""
    if not isinstance(result, dict):
        return False
    interfaces = [i for found in fields(result, "interfaces") for i in (found if isinstance(found, list) else [found])]
    ips = [ip for found in fields(result, "ips") for ip in (found if isinstance(found, list) else [found])]
    for iface in interfaces:
        if not isinstance(iface, dict):
            return False
        names, sandboxes = fields(iface, "name"), fields(iface, "sandbox")
        if not names or any(n != LOOPBACK_IFNAME for n in names) or not sandboxes or not all(sandboxes):
            return False
    for ip in ips:
        addresses = fields(ip, "address") if isinstance(ip, dict) else []
        if not addresses or not all(_is_loopback(a) for a in addresses):
            return False
    return True


def _is_loopback(address: object) -> bool:
    if not isinstance(address, str):
        return False
    try:
        return ipaddress.ip_interface(address).ip.is_loopback
    except ValueError:
        return False


def _loopback_chain(config: NetworkConfig) -> bool:
    """Whether a network list runs the loopback plugin alone (go-cni's WithLoNetwork, CRI-O's
    `cni-loopback`): every type, in any spelling Go takes, is `loopback`, and none has `ipam`."""
    try:
        _, _, plugins = plugin_list(config.raw)
    except ConfigError:
        return False
    for plugin in plugins:
        types = fields(plugin, "type")
        if not types or any(t != LOOPBACK_PLUGIN for t in types) or fields(plugin, "ipam"):
            return False
    return bool(plugins)


CRI_ARG = "K8S_POD_NAMESPACE"  # every CRI runtime passes it; podman and nerdctl do not
POD_NAME_ARG = "K8S_POD_NAME"
# A namespace is a DNS label; a pod name a DNS subdomain (Kubernetes' own validation).
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_POD_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?")


def _owner(doc: dict[str, Any], legacy: bool) -> tuple[Owner, str | None, str | None]:
    """Whose entry this is, by the CNI_ARGS its runtime passed (a legacy result keeps none):
    the owner, and the pod's namespace and name when both are there and read as names."""
    args = doc.get("cniArgs")
    if legacy or not isinstance(args, list):
        return "unknown", None, None
    pairs = [pair for pair in args if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)]
    values = {key: value for key, value in pairs if isinstance(value, str)}
    owner: Owner = "cri" if any(key == CRI_ARG for key, _ in pairs) else "other"
    namespace, name = values.get(CRI_ARG, ""), values.get(POD_NAME_ARG, "")
    if _NAMESPACE.fullmatch(namespace) and _POD_NAME.fullmatch(name):
        return owner, namespace, name
    return owner, None, None


def _split_legacy_name(name: str, ifname: str, networks: Set[str]) -> tuple[str, str]:
    """(network, container ID) of a pre-0.8 file, whose only record of them is its name."""
    suffix = f"-{ifname}"
    if not name.endswith(suffix):
        raise CacheCorrupt("legacy result: file name does not end with its interface name")
    stem = name[: -len(suffix)]
    for network in sorted(networks, key=len, reverse=True):
        if stem.startswith(network + "-") and is_cni_id(stem[len(network) + 1 :]):
            return network, stem[len(network) + 1 :]
    network, _, container_id = stem.rpartition("-")
    if _HEX_ID.fullmatch(container_id) and is_cni_id(network):
        return network, container_id
    raise CacheCorrupt("legacy result: cannot tell the network from the container ID in the file name")


def parse_cache_file(name: str, data: bytes, known_networks: Set[str]) -> CacheDocument:
    """What a cache file named `name` says; CacheCorrupt when it is not a cache file."""
    if not data.strip():
        raise CacheCorrupt("empty file")
    try:
        doc = parse_object(data)
    except NotAnObject as err:
        raise CacheCorrupt(str(err)) from None
    except ValueError as err:
        raise CacheCorrupt(f"truncated or invalid JSON: {err}") from None
    if doc.get("kind") == "cniCacheV1":
        key = ("containerId", is_cni_id), ("networkName", is_cni_id), ("ifName", is_ifname)
        for field, valid in key:
            if not (isinstance(value := doc.get(field), str) and valid(value)):
                raise CacheCorrupt(f"invalid {field} {str(value)[:80]!r}")
        netns = doc.get("netns")
        if isinstance(netns, str) and not is_path(netns):
            raise CacheCorrupt(f"invalid netns {netns[:80]!r}")
        return CacheDocument(doc, doc["containerId"], doc["networkName"], doc["ifName"], False)
    if "kind" in doc:
        raise CacheCorrupt(f"unknown cache kind {str(doc['kind'])[:80]!r}")
    if "cniVersion" not in doc:
        raise CacheCorrupt("neither a cniCacheV1 entry nor a bare result")
    sandboxed = [i for i in _result_interfaces(doc) if i.get("sandbox") and isinstance(i.get("name"), str)]
    ifname = str(sandboxed[0]["name"]) if sandboxed else "eth0"
    if not is_ifname(ifname):
        raise CacheCorrupt(f"invalid interface name {ifname[:80]!r}")
    network, cid = _split_legacy_name(name, ifname, known_networks)
    return CacheDocument({"result": doc}, cid, network, ifname, True)


# What a cache file's content said, as the memo keeps it: container ID, network, ifname, netns
# path, host ifnames, (owner, pod namespace, pod name), addresses, base64 config, _loopback_result.
_Said = tuple[
    str, str, str, str | None, tuple[str, ...], tuple[Owner, str | None, str | None], tuple[str, ...], str | None, bool
]


def collect_cache(
    cache_dir: str,
    known_networks: Set[str],
    memo: FileMemo[object] | None = None,
    other_roots: Sequence[str] = (),
    *,
    netns_dirs: Sequence[str] = (),
) -> CacheInventory:
    """The entries in each of RESULT_SUBDIRS beneath `cache_dir`, and in `results` beneath
    each of `other_roots` (cache dirs of their own). Each entry's netns path is looked up only
    in `netns_dirs` or as /proc/<pid>/ns/net (reaper.host.netns_paths)."""
    with NetnsPlaces(netns_dirs) as places:
        return _collect(cache_dir, known_networks, memo if memo is not None else FileMemo(), other_roots, places)


def _collect(
    cache_dir: str, known_networks: Set[str], memo: FileMemo[object], other_roots: Sequence[str], places: NetnsPlaces
) -> CacheInventory:
    entries: list[CacheEntry] = []
    corrupt_mtimes: dict[str, tuple[float, str]] = {}  # (mtime, root) of each corrupt file listed
    configs: dict[str, NetworkConfig | None] = {}  # each config decoded, by its base64
    loopback_configs: dict[str, bool] = {}  # each config's _loopback_chain, by its base64
    held: list[tuple[float, str, CacheEntry]] = []  # costless entries held: a heap, the newest on top
    beyond = 0  # costless entries found past COSTLESS_HELD
    lister = DirLister("cache")
    corrupt = lister.corrupt
    roots = [(cache_dir, sub) for sub in RESULT_SUBDIRS] + [(root, "results") for root in other_roots]
    for root, sub in roots:
        directory = os.path.join(root, sub)
        for dir_fd, entry in lister.scan(root, directory):
            path = os.path.join(directory, entry.name)
            if entry.is_symlink():
                corrupt.append(CorruptFile("cache", path, "symlink, not followed"))
                continue
            if entry.is_dir(follow_symlinks=False):
                continue
            try:
                lst = entry.stat(follow_symlinks=False)
            except OSError as err:
                corrupt.append(CorruptFile("cache", path, describe_oserror(err)))
                continue
            known = memo.get(path, lst)
            if isinstance(known, CorruptFile):
                if corrupt.append(known):
                    corrupt_mtimes[path] = (lst.st_mtime, root)
                continue
            said = known if isinstance(known, tuple) else None
            legacy = False
            if said is None:
                try:
                    data, _ = read_at(dir_fd, entry.name, MAX_CACHE_BYTES)
                    doc, cid, net, ifname, legacy = parse_cache_file(entry.name, data, known_networks)
                except OSError as err:
                    corrupt.append(CorruptFile("cache", path, describe_oserror(err)))
                    continue
                except (UnfitFile, CacheCorrupt) as err:
                    bad = CorruptFile("cache", path, str(err))
                    if corrupt.append(bad):  # only what is listed is kept: junk costs no memory
                        memo.put(path, lst, bad)
                        corrupt_mtimes[path] = (lst.st_mtime, root)
                    continue
                result = doc.get("result")
                encoded = doc.get("config")
                # What many entries share (a network's name, its config, the pod's namespace,
                # 127.0.0.1) is interned: one string for all, not one per entry held.
                owner, pod_namespace, pod_name = _owner(doc, legacy)
                said = (
                    cid, intern(net), intern(ifname), _netns_from(doc, result, ifname), _host_ifnames(result),
                    (owner, intern(pod_namespace) if pod_namespace is not None else None, pod_name),
                    tuple(map(intern, _addresses(result))), intern(encoded) if isinstance(encoded, str) else None,
                    not legacy and _loopback_result(result),
                )  # fmt: skip
                if not legacy:  # a legacy entry's reading depends on the known networks
                    memo.put(path, lst, said)
            encoded = said[7]  # each config decoded, and judged a loopback's, once a look
            if encoded is not None and encoded not in configs:
                configs[encoded] = _decode_config(encoded, path)
            config = configs.get(encoded)
            if said[8] and config is not None and encoded not in loopback_configs:
                loopback_configs[encoded] = _loopback_chain(config)
            loopback = said[8] and config is not None and loopback_configs[encoded]
            found = _entry(path, entry.name, root, lst, said, places, legacy=legacy, loopback_only=loopback)
            if found.netns_refused is not None:
                why = f"netns {shown(str(found.netns_path))} {found.netns_refused}"
                corrupt.append(CorruptFile("cache", path, why))
            if costless(found):
                # Held only among the COSTLESS_HELD oldest: one evicted (the newest held, or
                # this one) is counted, kept out of the memo, and read again next pass.
                heapq.heappush(held, (-found.mtime, path, found))
                if len(held) > COSTLESS_HELD:
                    _, evicted, _ = heapq.heappop(held)
                    memo.forget(evicted)
                    beyond += 1
                continue
            entries.append(found)
    entries += [found for _, _, found in sorted(held, reverse=True)]  # the oldest first
    decoded = tuple(c for c in configs.values() if c is not None)
    networks = known_networks | {c.name for c in decoded}
    named = [
        named_entry
        for bad in corrupt.listed()
        if bad.path in corrupt_mtimes
        and (named_entry := _entry_from_name(bad, *corrupt_mtimes[bad.path], networks)) is not None
    ]
    unheld = (
        (CorruptFile("cache", cache_dir, f"{beyond} loopback entries past the {COSTLESS_HELD} oldest a look holds: "
                     "counted, read again next pass", beyond),)
        if beyond else ()
    )  # fmt: skip
    return CacheInventory(tuple(entries + named), decoded, corrupt.records() + unheld)


def _entry(
    path: str,
    name: str,
    root: str,
    lst: os.stat_result,
    said: _Said,
    places: NetnsPlaces,
    *,
    legacy: bool = False,
    loopback_only: bool = False,
) -> CacheEntry:
    """Its netns is looked up now, only where a netns can be (`places`)."""
    cid, net, ifname, netns_path, host_ifnames, (owner, pod_namespace, pod_name), ips, _, _ = said
    netns, uninspectable, refused = places.look(netns_path)
    return CacheEntry(
        path=path,
        name=name,
        container_id=cid,
        network=net,
        ifname=ifname,
        netns_path=netns_path,
        netns=netns,
        host_ifnames=host_ifnames,
        legacy=legacy,
        mtime=lst.st_mtime,
        cache_dir=root,
        netns_uninspectable=uninspectable,
        netns_refused=refused,
        owner=owner,
        ips=ips,
        pod_namespace=pod_namespace,
        pod_name=pod_name,
        loopback_only=loopback_only,
    )


def _entry_from_name(bad: CorruptFile, mtime: float, cache_dir: str, networks: Set[str]) -> CacheEntry | None:
    """A corrupt cache file named `<known network>-<container ID>-<ifname>`; None for another name."""
    name = os.path.basename(bad.path)
    for network in sorted(networks, key=len, reverse=True):
        if not name.startswith(network + "-"):
            continue
        cid, sep, ifname = name[len(network) + 1 :].rpartition("-")
        if sep and is_cni_id(cid) and is_ifname(ifname):
            return CacheEntry(
                path=bad.path,
                name=name,
                container_id=cid,
                network=network,
                ifname=ifname,
                netns_path=None,
                netns=None,
                host_ifnames=(),
                legacy=False,
                mtime=mtime,
                cache_dir=cache_dir,
                corrupt=bad.error,
            )
    return None


def _decode_config(encoded: str, path: str) -> NetworkConfig | None:
    try:
        return parse_network_config(base64.b64decode(encoded, validate=True), f"cache:{path}")
    except (binascii.Error, ValueError, ConfigError):
        return None


def current_document(entry: CacheEntry) -> CacheDocument | None:
    """The file as it is now, when it still names this entry's attachment and is not legacy; else None."""
    try:
        data, _ = read_beneath(entry.cache_dir, entry.path, MAX_CACHE_BYTES)
        document = parse_cache_file(entry.name, data, {entry.network})
    except (OSError, UnfitFile, CacheCorrupt):
        return None
    return document if _names(document, entry) and not document.legacy else None


def _names(doc: CacheDocument, entry: CacheEntry) -> bool:
    return (doc.container_id, doc.network, doc.ifname) == (entry.container_id, entry.network, entry.ifname)


def cached_config(entry: CacheEntry) -> bytes | None:
    """The network list the entry says was ADDed, as the file holds it now; None when the file
    no longer names the attachment, is legacy (no config kept) or its config does not decode."""
    if entry.legacy or entry.corrupt is not None:
        return None
    document = current_document(entry)
    if document is None:
        return None
    try:
        return base64.b64decode(str(document.doc.get("config", "")), validate=True) or None
    except (binascii.Error, ValueError):
        return None


def find(look: Look) -> Found[CacheEntry]:
    cache_dir = look.options.cache_dir
    multus_dirs = [d for d in multus.cni_dirs(look)[0] if d != os.path.join(cache_dir, multus.DEFAULT_SUBDIR)]
    known = {c.name for c in look.configs}
    found = collect_cache(cache_dir, known, look.memo.of("cache"), multus_dirs, netns_dirs=look.options.netns_dirs)
    return Found(found.entries, found.corrupt, configs=found.configs)


def identity(entry: CacheEntry) -> Identity:
    return ("cache", entry.path)


def ref(entry: CacheEntry) -> ResourceRef:
    details: dict[str, DetailValue] = {"path": entry.path, "legacy": entry.legacy, "owner": entry.owner}
    if entry.pod_namespace is not None and entry.pod_name is not None:
        details["pod"] = f"{entry.pod_namespace}/{entry.pod_name}"
    details.update(optional(corrupt=entry.corrupt, netns_refused=entry.netns_refused))
    return ResourceRef(kind="cache", name=entry.name, created_at=entry.mtime, details=details, identity=identity(entry))


def tie(entry: CacheEntry) -> OwnKey:
    return OwnKey(
        container_id=entry.container_id,
        network=entry.network,
        ifname=entry.ifname,
        netns=entry.netns,
        uninspectable_netns=entry.netns_path if entry.netns_uninspectable and entry.netns_path else None,
    )


def _remove(entry: CacheEntry, ctx: ReclaimContext) -> Done:
    try:
        data, st = read_beneath(entry.cache_dir, entry.path, MAX_CACHE_BYTES)
    except FileNotFoundError:
        return Done.freed()
    except (OSError, UnfitFile) as err:
        return Done.left(f"cannot re-read: {err}")
    try:
        document = parse_cache_file(entry.name, data, {entry.network})
    except CacheCorrupt:
        if entry.corrupt is None:
            return Done.left("unreadable now, though it was read before; left alone")
        return remove_or_quarantine(entry.cache_dir, entry.path, st, ctx.quarantine)  # as unreadable as judged
    if not _names(document, entry):
        return Done.left("now names another attachment; left alone")
    if entry.loopback_only and not _loopback_document(document, entry.path):
        # Judged costless (and so taken past --max-reap) as a loopback's: it must still be one.
        return Done.left("no longer a loopback's entry alone, as it was judged; left alone")
    return remove_or_quarantine(entry.cache_dir, entry.path, st, ctx.quarantine)


def _loopback_document(document: CacheDocument, path: str) -> bool:
    """Whether a cache document's result and config are a loopback's alone."""
    if document.legacy or not _loopback_result(document.doc.get("result")):
        return False
    encoded = document.doc.get("config")
    config = _decode_config(encoded, path) if isinstance(encoded, str) else None
    return config is not None and _loopback_chain(config)


def reclaim(entries: Sequence[CacheEntry], ctx: ReclaimContext) -> dict[Identity, Done]:
    return {identity(entry): _remove(entry, ctx) for entry in entries}


def claims(entry: CacheEntry) -> tuple[str, ...]:
    return entry.ips


def costless(entry: CacheEntry) -> bool:
    """Whether removing the entry costs no pod anything, were the verdict wrong: a loopback's
    entry (loopback_only), read whole, with no namespace found for it and no host interface. A
    live pod's loopback needs nothing from the file (its DEL only sets `lo` down)."""
    return (
        entry.loopback_only
        and entry.corrupt is None
        and not entry.legacy
        and entry.netns is None
        and not entry.netns_uninspectable
        and entry.netns_refused is None
        and not entry.host_ifnames
    )


def del_document(entries: Sequence[CacheEntry]) -> tuple[dict[str, Any], str] | None:
    """The cniCacheV1 object a DEL runs from and its file: the first entry neither legacy nor
    corrupt, the one at libcni's own path for its key first (the only file a runtime's DEL
    reads), as current_document reads it; None when there is none, or current_document is."""
    usable = sorted(
        (e for e in entries if not e.legacy and e.corrupt is None),
        key=lambda e: e.name != f"{e.network}-{e.container_id}-{e.ifname}",
    )
    document = current_document(usable[0]) if usable else None
    return (document.doc, usable[0].path) if document is not None else None


KIND: Kind[CacheEntry] = Kind(
    name="cache",
    find=find,
    identity=identity,
    ref=ref,
    tie=tie,
    reclaim=reclaim,
    last=True,
    quarantinable=True,
    del_frees=False,
    claims=claims,
)
