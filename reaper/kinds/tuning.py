"""The tuning plugin's backup file: `<data dir>/<container ID>_<ifname>.json`.

The name is the key (`split_name`): any other name, or an ambiguous one, is a corrupt record,
never acted on. Tie: ContainerTie; not `last` (DEL needs the netns with it). When tuning leaves
it, and where it is read: docs/design.md, "In depth: the kinds".
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from msgspec import Struct

from reaper.host.jsondoc import parse_object
from reaper.host.memo import FileMemo
from reaper.kinds import Found, Kind, Look, optional, scratch
from reaper.kinds.scratch import ScratchFile, ScratchFormat
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
        values = zip(KEYS, (self.mac, self.promisc, self.mtu, self.allmulti, self.txqlen), strict=True)
        return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values if v is not None)


TuningFile = ScratchFile[TuningBackup]


def split_name(name: str) -> tuple[str, str]:
    """(container ID, ifname) of a `<container ID>_<ifname>.json` file name; ValueError (the
    reason) for any other name, an ambiguous one included."""
    container_id, sep, ifname = name.removesuffix(SUFFIX).rpartition("_")
    if not (name.endswith(SUFFIX) and sep):
        raise ValueError("file name is not <container ID>_<ifname>.json")
    if not is_cni_id(container_id):
        raise ValueError("file name's container ID is not a container ID")
    if not is_ifname(ifname):
        raise ValueError("file name's ifname is not an interface name")
    if "_" in container_id:
        raise ValueError("file name is ambiguous: the container ID or the ifname holds a '_'")
    return container_id, ifname


def _count(doc: dict[str, Any], key: str, least: int) -> int | None:
    value = doc.get(key)
    if key in doc and (not isinstance(value, int) or isinstance(value, bool) or not least <= value < _U32):
        raise ValueError(f"invalid {key} {str(value)[:40]!r}")
    return value


def _flag(doc: dict[str, Any], key: str) -> bool | None:
    value = doc.get(key)
    if key in doc and not isinstance(value, bool):
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


FORMAT: ScratchFormat[TuningBackup] = ScratchFormat(NAME, parse_backup, MAX_TUNING_BYTES, lambda n: split_name(n)[0])


def collect(dirs: Iterable[str], memo: FileMemo[object] | None = None) -> Found[TuningFile]:
    """The backup files in each dir, each read as a root of its own."""
    files, corrupt = scratch.collect(FORMAT, [(d, d) for d in dirs], memo)
    return Found(tuple(files), tuple(corrupt))


def find(look: Look) -> Found[TuningFile]:
    return scratch.find_files(FORMAT, look, {PLUGIN}, "dataDir", (DEFAULT_DIR, DEFAULT_DIR))


def _details(file: TuningFile) -> scratch.Details:
    restores = file.content.restores() if file.content is not None else None
    return optional(ifname=split_name(os.path.basename(file.path))[1], restores=restores)


KIND: Kind[TuningFile] = scratch.file_kind(FORMAT, find, _details, last=False)
