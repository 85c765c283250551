"""Network namespace pins: files under the netns dirs with a namespace bind-mounted on them.

Identity: the pin's path. A pin joins the attachment that owns its namespace (a cache entry
or a sandbox naming it); a pin nothing names stands alone, and is a candidate only when its
name is one a runtime makes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from msgspec import Struct
from msgspec.structs import asdict

from reaper.host.files import DirLister
from reaper.host.mounts import unpin_hazard
from reaper.host.pins import list_pins, unpin
from reaper.kinds import Found, Kind, Look, ReclaimContext
from reaper.model import CorruptFile, DetailValue, Done, Identity, NetnsTie, NsKey, ResourceRef
from reaper.names import is_runtime_netns_name


class Pin(NamedTuple):
    """A namespace pin with a namespace mounted on it: what a runtime passes as CNI_NETNS."""

    ns: NsKey
    path: str


class NetnsPin(Struct, frozen=True, kw_only=True, gc=False):
    """A file under a netns dir, normally a bind mount of a network namespace."""

    name: str
    path: str
    directory: str
    ns: NsKey
    is_namespace: bool  # False: a stale plain file, no namespace mounted on it
    mtime: float
    runtime_named: bool  # the name is one a container runtime makes


def collect_pins(
    dirs: tuple[str, ...], patterns: Sequence[re.Pattern[str]]
) -> tuple[list[NetnsPin], list[CorruptFile]]:
    lister = DirLister("netns")
    pins = [
        NetnsPin(**asdict(listed), directory=directory, runtime_named=is_runtime_netns_name(listed.name, patterns))
        for directory in dirs
        for listed in list_pins(lister, directory)
    ]
    return pins, list(lister.corrupt.records())


def find(look: Look) -> Found[NetnsPin]:
    pins, corrupt = collect_pins(look.options.netns_dirs, look.options.netns_patterns)
    return Found(tuple(pins), tuple(corrupt))


def identity(pin: NetnsPin) -> Identity:
    return identity_at(pin.path)


def identity_at(path: str) -> Identity:
    return ("netns", path)


def unpinned_any(done: Mapping[Identity, Done]) -> bool:
    """Whether `done` (what a step's kinds did) freed a pin."""
    return any(ident[:1] == ("netns",) and result.ok for ident, result in done.items())


def ref(pin: NetnsPin) -> ResourceRef:
    details: dict[str, DetailValue] = {"path": pin.path}
    if not pin.is_namespace:
        details["stale"] = True
    return ResourceRef(kind="netns", name=pin.name, created_at=pin.mtime, details=details, identity=identity(pin))


def tie(pin: NetnsPin) -> NetnsTie:
    return NetnsTie(pin.ns if pin.is_namespace else None, pin.path, pin.runtime_named)


def reclaim(pins: Sequence[NetnsPin], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Unmount and unlink every pin at once, so the kernel drops their veths in one batch; never
    one whose namespace a live sandbox names, a process is in, or a mount holds elsewhere (it
    would outlive the pin: reaper.host.nsmounts.in_use)."""
    hazard = unpin_hazard(ctx.netns_dirs)
    if hazard is not None:
        return {identity(pin): Done.left(hazard) for pin in pins}
    busy = ctx.busy()
    return {identity(pin): _unpin(pin, ctx, busy) for pin in pins}


def _unpin(pin: NetnsPin, ctx: ReclaimContext, busy: Mapping[NsKey, str]) -> Done:
    if pin.directory not in ctx.netns_dirs or os.path.join(pin.directory, pin.name) != pin.path or "/" in pin.name:
        return Done.left("not directly inside a netns dir")

    def judge(key: NsKey) -> str | None:
        return "a live sandbox names this netns" if key in ctx.live_netns else busy.get(key)

    return unpin(pin.directory, pin.name, was_namespace=pin.is_namespace, ns=pin.ns, judge=judge)


def as_pin(pin: NetnsPin) -> Pin | None:
    """The record as a Pin; None when it is a stale file, no namespace mounted on it."""
    return Pin(pin.ns, pin.path) if pin.is_namespace else None


def keeps_netns(pin: NetnsPin) -> NsKey | None:
    """The namespace mounted on the pin, which lives (its addresses configured) while it does."""
    return pin.ns if pin.is_namespace else None


def proves(pin: NetnsPin, netns: NsKey | None) -> bool:
    return pin.is_namespace


KIND: Kind[NetnsPin] = Kind(
    name="netns",
    find=find,
    identity=identity,
    ref=ref,
    tie=tie,
    reclaim=reclaim,
    del_needs=True,
    del_frees=False,
    proves=proves,
    keeps_netns=keeps_netns,
)
