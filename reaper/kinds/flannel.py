"""Flannel's per-container file: `<data dir>/<container ID>`.

flannel-io/cni-plugin's ADD writes the delegate config it hands to its delegate (bridge by
default) to `<dataDir>/<container ID>` before it runs the delegate, as Go's json.Marshal of a
map writes it: compact, keys sorted. Its DEL reads the file, runs the delegate's DEL with those
bytes, then removes it; with no file, DEL does nothing at all, so the delegate's host-local
lease leaks. dataDir is the plugin config's `dataDir`, by default /var/lib/cni/flannel, which is
`flannel` beneath --cni-cache-dir; each `dataDir` of a flannel plugin in the node's own configs
is read too, as a root of its own (never a dir a cached config names, nor `/` or another dir
that holds one the reaper reads for something else).

Identity: the file's path. Tie: its name, the container ID: the file joins that container's
primary attachment, or makes one of its own when the container has nothing else here. What DEL
needs: it goes last, after the rest of its attachment, and only while it is still the file that
was judged.
"""

from __future__ import annotations

import os

from msgspec import Struct

from reaper.host.jsondoc import parse_object
from reaper.kinds import Found, Kind, Look, scratch
from reaper.kinds.scratch import ScratchFile, ScratchFormat
from reaper.model import CorruptFile
from reaper.names import PLUGIN_TYPE, is_cni_id

NAME = "flannel"
PLUGIN = "flannel"  # the type of flannel's plugin in a network config
DEFAULT_SUBDIR = "flannel"  # beneath the cache dir: flannel's default /var/lib/cni/flannel


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


def data_dirs(look: Look) -> tuple[list[tuple[str, str]], list[CorruptFile]]:
    """(root, directory) of every dir flannel may write to on this node, and the dataDirs of
    the configs that are not read (see scratch.config_roots)."""
    cache_dir = look.options.cache_dir
    named, refused = scratch.config_roots(NAME, look, {PLUGIN}, "dataDir")
    return [(cache_dir, os.path.join(cache_dir, DEFAULT_SUBDIR))] + [(d, d) for d in named], refused


def find(look: Look) -> Found[FlannelFile]:
    dirs, refused = data_dirs(look)
    files, corrupt = scratch.collect(FORMAT, dirs, look.memo.of(NAME))
    return Found(tuple(files), tuple(refused + corrupt))


def _details(file: FlannelFile) -> scratch.Details:
    if file.content is None:
        return {}
    return {"network": file.content.network, "type": file.content.plugin_type}


KIND: Kind[FlannelFile] = scratch.file_kind(FORMAT, find, _details, last=True)
