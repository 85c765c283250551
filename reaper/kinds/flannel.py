"""Flannel's per-container file: `<data dir>/<container ID>`, the delegate config its DEL runs.

Its DEL runs only once the file passed a cached config's rules
(reaper.reap.trust.delegate_file_refusal): `scratch_path` says which file, `delegate_plugins`
what runs, `delegate_baseline` what the node's config would have put there. Where it is read,
and its tie: docs/design.md, "In depth: the kinds".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from msgspec import Struct

from reaper.host.jsondoc import go_keys, parse_object
from reaper.kinds import Found, Kind, Look, scratch
from reaper.kinds.scratch import ScratchFile, ScratchFormat
from reaper.names import PLUGIN_TYPE, is_cni_id

NAME = "flannel"
PLUGIN = "flannel"  # the type of flannel's plugin in a network config
DEFAULT_SUBDIR = "flannel"  # beneath the cache dir: flannel's default /var/lib/cni/flannel
# Where flannel's DEL reads when its config names no dataDir (flannel.go defaultDataDir): its
# own default, wherever --cni-cache-dir points.
DATA_DIR = "/var/lib/cni/flannel"


class FlannelDelegate(Struct, frozen=True):
    """What the file says: the delegate config flannel ran, and runs again for DEL."""

    network: str  # the flannel network's name, which flannel gives its delegate
    plugin_type: str  # the delegate plugin (bridge, unless the config names another)


FlannelFile = ScratchFile[FlannelDelegate]


def parse_delegate(data: bytes) -> FlannelDelegate:
    """The delegate config flannel wrote; ValueError when it is not one."""
    doc = parse_object(data)
    name, plugin_type = doc.get("name"), doc.get("type")
    if not (isinstance(plugin_type, str) and PLUGIN_TYPE.fullmatch(plugin_type)):
        raise ValueError(f"invalid delegate type {str(plugin_type)[:80]!r}")
    if not (isinstance(name, str) and is_cni_id(name)):
        raise ValueError(f"invalid network name {str(name)[:80]!r}")
    return FlannelDelegate(name, plugin_type)


FORMAT: ScratchFormat[FlannelDelegate] = ScratchFormat(NAME, parse_delegate)


def find(look: Look) -> Found[FlannelFile]:
    cache_dir = look.options.cache_dir
    return scratch.find_files(FORMAT, look, {PLUGIN}, "dataDir", (cache_dir, os.path.join(cache_dir, DEFAULT_SUBDIR)))


def _details(file: FlannelFile) -> scratch.Details:
    if file.content is None:
        return {}
    return {"network": file.content.network, "type": file.content.plugin_type}


KIND: Kind[FlannelFile] = scratch.file_kind(FORMAT, find, _details, last=True)


def scratch_path(plugin: Mapping[str, Any], container_id: str) -> str:
    """The file flannel's DEL reads for `plugin` (its config, keys folded by
    reaper.host.jsondoc.go_keys, as flannel's decoder reads them): `<dataDir>/<container ID>`,
    dataDir defaulting to DATA_DIR (a JSON null keeps the default, as Go's decoder does).
    ValueError when dataDir is no string: flannel then fails before it reads anything."""
    data_dir = plugin.get("datadir")
    if data_dir is None:
        data_dir = DATA_DIR
    if not isinstance(data_dir, str):
        raise ValueError("its dataDir is not a string")
    return scratch.go_join(data_dir, container_id)


def delegate_plugins(data: bytes) -> list[dict[str, Any]]:
    """What flannel's DEL runs from a file of these bytes: the file itself, as the stdin of the
    plugin its `type` names, keys folded by go_keys. ValueError when flannel would not run it as
    one plugin config, or when it holds a prevResult, which flannel never writes (its ADD makes
    the file from its own config and the subnet file before any plugin has a result)."""
    doc = go_keys(parse_object(data))
    if "prevresult" in doc:
        raise ValueError("it holds a prevResult, which flannel never writes")
    return [doc]


def delegate_baseline(plugin: Mapping[str, Any]) -> dict[str, Any]:
    """The delegate the node's flannel plugin config (keys folded) hands its delegate on ADD
    (flannel_linux.go doCmdAdd): its `delegate` object, type bridge unless it names one, with
    an IPAM section made from its own `ipam`, type host-local unless it names one. The only
    place a path or steering value in a flannel file may come from."""
    delegate = plugin.get("delegate")
    baseline = dict(delegate) if isinstance(delegate, dict) else {}
    baseline.setdefault("type", "bridge")
    ipam = plugin.get("ipam")
    baseline["ipam"] = dict(ipam) if isinstance(ipam, dict) else {}
    baseline["ipam"].setdefault("type", "host-local")
    return baseline
