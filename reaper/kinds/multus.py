"""Multus' per-container file: `<cniDir>/<container ID>`.

k8snetworkplumbingwg/multus-cni's ADD writes the delegates it is about to attach (the cluster
network first, then each secondary network) to `<cniDir>/<container ID>` before it runs any of
them: Go's json.Marshal of its `[]*DelegateNetConf`, a JSON array of objects whose fields are
the struct's own names (`Conf`, `ConfList`, `Name`, `Bytes`: the delegate's config, base64).
Its DEL reads the file to know which delegates to DEL, then removes it; with no file and the pod
gone from the API, DEL does nothing. cniDir is the multus config's `cniDir`, by default
/var/lib/cni/multus, which is `multus` beneath --cni-cache-dir; each `cniDir` of a multus (or
thick-plugin shim) config in the node's own conf dir is read too, as a root of its own (as
flannel's dataDirs are: see scratch.config_roots). The delegates' own libcni results, under
`<cniDir>/results/`, are cache entries (reaper.kinds.cache).

Identity: the file's path. Tie: its name, the container ID: the file joins that container's
primary attachment, or makes one of its own when the container has nothing else here. What DEL
needs: it goes last, after the rest of its attachment, and only while it is still the file that
was judged.
"""

from __future__ import annotations

import os
import re

from msgspec import Struct

from reaper.host.jsondoc import parse_json
from reaper.kinds import Found, Kind, Look, scratch
from reaper.kinds.scratch import ScratchFile, ScratchFormat
from reaper.model import CorruptFile

NAME = "multus"
# The thin plugin's type, and the thick plugin's shim (whose cniDir is the daemon's; the
# upstream daemonset mounts the host's /var/lib/cni/multus at that same path).
PLUGINS = frozenset({"multus", "multus-shim"})
DEFAULT_SUBDIR = "multus"  # beneath the cache dir: multus' default /var/lib/cni/multus
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
    """Each cniDir the node's own multus configs name, and those not read (see
    scratch.config_roots)."""
    return scratch.config_roots(NAME, look, PLUGINS, "cniDir")


def data_dirs(look: Look) -> tuple[list[tuple[str, str]], list[CorruptFile]]:
    """(root, directory) of every dir multus may write its per-container files to."""
    cache_dir = look.options.cache_dir
    named, refused = cni_dirs(look)
    return [(cache_dir, os.path.join(cache_dir, DEFAULT_SUBDIR))] + [(d, d) for d in named], refused


def find(look: Look) -> Found[MultusFile]:
    dirs, refused = data_dirs(look)
    files, corrupt = scratch.collect(FORMAT, dirs, look.memo.of(NAME))
    return Found(tuple(files), tuple(refused + corrupt))


def _shown(names: tuple[str, ...]) -> str:
    return ",".join(n if _SHOWN_NAME.fullmatch(n) else "?" for n in names[:8]) + (",..." if len(names) > 8 else "")


def _details(file: MultusFile) -> scratch.Details:
    if file.content is None:
        return {}
    return {"delegates": file.content.count, "networks": _shown(file.content.names)}


KIND: Kind[MultusFile] = scratch.file_kind(FORMAT, find, _details, last=True)
