"""Multus' per-container file: `<cniDir>/<container ID>`, the delegates its DEL runs.

Its DEL runs only once the file and the delegates' results (cache entries, in
`<cniDir>/results/`) passed a cached config's rules (reaper.reap.trust.delegate_file_refusal):
`scratch_path` says which file, `delegate_runs` what in it runs. Where it is read, and its tie:
docs/design.md, "In depth: the kinds".
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from typing import Any

from msgspec import Struct

from reaper.host.jsondoc import go_keys, parse_json
from reaper.kinds import Found, Kind, Look, scratch
from reaper.kinds.scratch import ScratchFile, ScratchFormat
from reaper.model import CorruptFile
from reaper.names import is_cni_id, is_ifname

NAME = "multus"
# The thin plugin's type, and the thick plugin's shim (whose cniDir is the daemon's; the
# upstream daemonset mounts the host's /var/lib/cni/multus at that same path).
PLUGINS = frozenset({"multus", "multus-shim"})
DEFAULT_SUBDIR = "multus"  # beneath the cache dir: multus' default /var/lib/cni/multus
# Where multus' DEL reads when its config names no cniDir (pkg/types/conf.go defaultCNIDir):
# its own default, wherever --cni-cache-dir points.
CNI_DIR = "/var/lib/cni/multus"
RESULTS = "results"
MAX_KEPT_NAMES = 64  # of a file's delegates, the names a record keeps
MAX_KEPT_NAME = 256
_SHOWN_NAME = re.compile(r"[!-~]{1,253}")  # printable ASCII: a network, or <namespace>/<name>


class MultusDelegates(Struct, frozen=True):
    """What the file says: the delegates multus attached, in the order it attached them."""

    count: int
    names: tuple[str, ...]  # each delegate's `Name` (the first MAX_KEPT_NAMES, cut short)


MultusFile = ScratchFile[MultusDelegates]


def parse_delegates(data: bytes) -> MultusDelegates:
    """The delegate list multus wrote; ValueError when it is not one."""
    doc = parse_json(data)
    if not isinstance(doc, list) or not doc:
        raise ValueError("not a non-empty JSON array of delegates")
    names = []
    for delegate in doc:
        name = delegate.get("Name") if isinstance(delegate, dict) else None
        if not isinstance(name, str):
            raise ValueError("a delegate that is not an object with a Name")
        names.append(name[:MAX_KEPT_NAME])
    return MultusDelegates(len(doc), tuple(names[:MAX_KEPT_NAMES]))


FORMAT: ScratchFormat[MultusDelegates] = ScratchFormat(NAME, parse_delegates)


def cni_dirs(look: Look) -> tuple[list[str], list[CorruptFile]]:
    """Each cniDir the node's own multus configs name, and those not read (scratch.config_roots)."""
    return scratch.config_roots(NAME, look, PLUGINS, "cniDir")


def find(look: Look) -> Found[MultusFile]:
    cache_dir = look.options.cache_dir
    return scratch.find_files(FORMAT, look, PLUGINS, "cniDir", (cache_dir, os.path.join(cache_dir, DEFAULT_SUBDIR)))


def _shown(names: tuple[str, ...]) -> str:
    return ",".join(n if _SHOWN_NAME.fullmatch(n) else "?" for n in names[:8]) + (",..." if len(names) > 8 else "")


def _details(file: MultusFile) -> scratch.Details:
    if file.content is None:
        return {}
    return {"delegates": file.content.count, "networks": _shown(file.content.names)}


KIND: Kind[MultusFile] = scratch.file_kind(FORMAT, find, _details, last=True)


def scratch_path(plugin: Mapping[str, Any], container_id: str) -> str:
    """The file multus' DEL reads for `plugin` (its config, keys folded by
    reaper.host.jsondoc.go_keys): `<cniDir>/<container ID>`, cniDir defaulting to CNI_DIR.
    ValueError when cniDir is no string: multus then fails before it reads anything."""
    cni_dir = plugin.get("cnidir")
    if cni_dir is None or cni_dir == "":
        cni_dir = CNI_DIR
    if not isinstance(cni_dir, str):
        raise ValueError("its cniDir is not a string")
    return scratch.go_join(cni_dir, container_id)


class DelegateRun(Struct, frozen=True):
    """One delegate multus' DEL runs through libcni, as the file says."""

    network: str  # the name libcni gives it, and names its cached result by
    ifname: str  # the interface multus asks it to delete (pkg/multus getIfname)
    plugins: tuple[dict[str, Any], ...]  # keys folded by go_keys, each with the network's name


def delegate_runs(data: bytes, ifname: str) -> list[DelegateRun]:
    """What multus' DEL runs from a file of these bytes, for a DEL of `ifname`: each delegate's
    `Bytes` (base64) as a config list when its `ConfList` has plugins, else as one plugin
    config, in either case every plugin a decoder could find there (a superset of what libcni
    runs). ValueError when a delegate could not be checked (no config, keys written twice, a
    network or interface name that is no name, as it would become a path)."""
    doc = go_keys(parse_json(data))
    if not isinstance(doc, list) or not doc:
        raise ValueError("not a non-empty JSON array of delegates")
    runs = []
    for index, delegate in enumerate(doc):
        if not isinstance(delegate, dict):
            raise ValueError("a delegate that is not an object")
        try:
            raw = base64.b64decode(str(delegate.get("bytes") or ""), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a delegate whose Bytes are not base64") from None
        config = go_keys(parse_json(raw)) if raw else None
        if not isinstance(config, dict):
            raise ValueError("a delegate with no config")
        conf_list = delegate.get("conflist")
        listed = isinstance(conf_list, dict) and bool(conf_list.get("plugins"))
        network = config.get("name")
        if not (isinstance(network, str) and is_cni_id(network)):
            raise ValueError(f"a delegate whose network name {str(network)[:80]!r} is no CNI name")
        plugins = config.get("plugins") if listed or "type" not in config else [config]
        if not isinstance(plugins, list) or not all(isinstance(p, dict) for p in plugins):
            raise ValueError("a delegate whose plugins are not objects")
        # libcni gives every plugin of a list the list's name.
        named = tuple({**p, "name": network} if listed else p for p in plugins)
        wanted = delegate.get("ifnamerequest")
        name = wanted if isinstance(wanted, str) and wanted else ifname if index == 0 else f"net{index}"
        if not is_ifname(name):
            raise ValueError(f"a delegate whose interface name {name[:40]!r} is no interface name")
        runs.append(DelegateRun(network, name, named))
    return runs


def result_path(cni_dir_file: str, run: DelegateRun, container_id: str) -> str:
    """The cached result libcni reads for a delegate's DEL, beneath the cniDir that holds
    `cni_dir_file` (multus' file): `<cniDir>/results/<network>-<container ID>-<ifname>`."""
    return scratch.go_join(os.path.dirname(cni_dir_file), f"{RESULTS}/{run.network}-{container_id}-{run.ifname}")
