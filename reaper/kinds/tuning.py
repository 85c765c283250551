"""The tuning plugin's backup file: `<data dir>/<container ID>_<ifname>.json`.

containernetworking/plugins' tuning meta plugin (plugins/meta/tuning/tuning.go, v1.0.0 to
v1.9.1), when its config (or the pod's args or runtimeConfig) sets mac, mtu, promisc, allmulti
or txQLen, saves what the interface had before it changes it: createBackup writes
`json.MarshalIndent(configToRestore, "", " ")` (the keys mac, promisc, mtu, allmulti and, since
v1.4.0, txQLen, each omitted when unset; `{}` for an interface with no MAC) to
`<dataDir>/<container ID>_<ifname>.json`, mode 0600. Its DEL enters the netns, puts the old
values back and removes the file only once that worked: with the netns gone (the runtime's DEL
came too late, or never ran), with the interface gone, or with a file it cannot parse, it
returns early and the file stays for good. dataDir is the plugin config's `dataDir`, by
default /run/cni/tuning; each `dataDir` of a tuning plugin in the node's own configs is read
too, as a root of its own (never a dir a cached config names, nor `/` or another dir that holds
one the reaper reads for something else: see scratch.config_roots).

The name is the key: split on its last `_`, the container ID before it (a CNI ID), the ifname
after it (an interface name, which the kernel lets hold a `_`). A container ID holding a `_`
makes the name ambiguous (`<id>_net_1.json` may be `<id>` with `net_1`, or `<id>_net` with
`1`); runtimes make hex IDs, so such a name, like every name not of that form, is a corrupt
record, never acted on: read as another container's, a live pod's backup would go.

Identity: the file's path. Tie: ContainerTie(its container ID). Not an OwnKey: an attachment is
(container ID, network, ifname) and the file names no network, so a key of its own would split
the container's resources over two attachments. Not a Claim: its commonest leak is a file
alone (the runtime's DEL freed the lease, but the netns was gone, so tuning's DEL kept the
file), which a Claim would leave unconfirmed for ever. A ContainerTie joins the container's
primary attachment, whose verdict (the runtime's word on that sandbox) is the container's, or
makes one of its own when the container has nothing else on the node; its ifname is in the
report's details. Not `last`: DEL needs the netns with it, not the file alone, and once the
netns is gone the file serves no DEL. Reclaiming re-reads it beneath the same root and removes
(or quarantines) only the very file judged (scratch.reclaim).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from msgspec import Struct

from reaper.host.jsondoc import parse_object
from reaper.host.memo import FileMemo
from reaper.kinds import Found, Kind, Look, scratch
from reaper.kinds.scratch import ScratchFile, ScratchFormat
from reaper.model import CorruptFile
from reaper.names import is_cni_id, is_ifname

NAME = "tuning"
PLUGIN = "tuning"  # the type of the tuning plugin in a network config
# tuning.go's defaultDataDir; find() reads it when it is called (tests point it elsewhere).
DEFAULT_DIR = "/run/cni/tuning"
SUFFIX = ".json"
MAX_TUNING_BYTES = 64 << 10  # the plugin writes under 200 bytes
# Go's net.HardwareAddr.String(): lowercase hex bytes joined by colons (MAX_ADDR_LEN 32).
_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){0,31}")
_U32 = 1 << 32
KEYS = ("mac", "promisc", "mtu", "allmulti", "txQLen")  # configToRestore's fields, in order


class TuningBackup(Struct, frozen=True, kw_only=True):
    """What the file says: the interface's values before tuning changed them (None: not saved)."""

    mac: str | None = None
    promisc: bool | None = None
    mtu: int | None = None
    allmulti: bool | None = None
    txqlen: int | None = None

    def restores(self) -> str:
        values = (self.mac, self.promisc, self.mtu, self.allmulti, self.txqlen)
        shown = [
            f"{k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in zip(KEYS, values, strict=True)
            if v is not None
        ]
        return ",".join(shown)


TuningFile = ScratchFile[TuningBackup]


def split_name(name: str) -> tuple[str, str]:
    """(container ID, ifname) of a `<container ID>_<ifname>.json` file name; ValueError (the
    reason) for any other name, an ambiguous one included."""
    if not name.endswith(SUFFIX):
        raise ValueError("file name is not <container ID>_<ifname>.json")
    container_id, sep, ifname = name[: -len(SUFFIX)].rpartition("_")
    if not sep:
        raise ValueError("file name is not <container ID>_<ifname>.json")
    if not is_cni_id(container_id):
        raise ValueError("file name's container ID is not a container ID")
    if not is_ifname(ifname):
        raise ValueError("file name's ifname is not an interface name")
    if "_" in container_id:
        raise ValueError("file name is ambiguous: the container ID or the ifname holds a '_'")
    return container_id, ifname


def owner(name: str) -> str:
    return split_name(name)[0]


def _count(doc: dict[str, Any], key: str, least: int) -> int | None:
    value = doc.get(key)
    if value is None and key not in doc:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value < _U32:
        raise ValueError(f"invalid {key} {str(value)[:40]!r}")
    return value


def _flag(doc: dict[str, Any], key: str) -> bool | None:
    value = doc.get(key)
    if value is None and key not in doc:
        return None
    if not isinstance(value, bool):
        raise ValueError(f"invalid {key} {str(value)[:40]!r}")
    return value


def parse_backup(data: bytes) -> TuningBackup:
    """The backup tuning wrote; ValueError when it is not one."""
    doc = parse_object(data)
    unknown = sorted(k for k in doc if k not in KEYS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0][:40]!r}")
    mac = doc.get("mac")
    if "mac" in doc and not (isinstance(mac, str) and _MAC.fullmatch(mac)):
        raise ValueError(f"invalid mac {str(mac)[:40]!r}")
    # mtu is omitted when 0 (omitempty on an int); txQLen is a pointer, so 0 is written.
    return TuningBackup(
        mac=mac,
        promisc=_flag(doc, "promisc"),
        mtu=_count(doc, "mtu", 1),
        allmulti=_flag(doc, "allmulti"),
        txqlen=_count(doc, "txQLen", 0),
    )


FORMAT: ScratchFormat[TuningBackup] = ScratchFormat(NAME, parse_backup, MAX_TUNING_BYTES, owner)


def data_dirs(look: Look) -> tuple[list[str], list[CorruptFile]]:
    """Every dir tuning may write its backups to on this node: the default and each dataDir
    of a tuning plugin in the node's own configs, and the dataDirs not read."""
    named, refused = scratch.config_roots(NAME, look, {PLUGIN}, "dataDir")
    return [DEFAULT_DIR] + [d for d in named if d != DEFAULT_DIR], refused


def collect(dirs: Iterable[str], memo: FileMemo[object] | None = None) -> Found[TuningFile]:
    """The backup files in each dir, each read as a root of its own."""
    files, corrupt = scratch.collect(FORMAT, [(d, d) for d in dirs], memo)
    return Found(tuple(files), tuple(corrupt))


def find(look: Look) -> Found[TuningFile]:
    dirs, refused = data_dirs(look)
    found = collect(dirs, look.memo.of(NAME))
    return Found(found.records, tuple(refused) + found.corrupt)


def ifname_of(file: TuningFile) -> str:
    return split_name(os.path.basename(file.path))[1]


def _details(file: TuningFile) -> scratch.Details:
    shown: scratch.Details = {"ifname": ifname_of(file)}
    if file.content is not None:
        shown["restores"] = file.content.restores()
    return shown


KIND: Kind[TuningFile] = scratch.file_kind(FORMAT, find, _details, last=False)
