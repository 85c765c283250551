"""CRI-O's other namespace pins: `<namespaces_dir>/{ipc,uts,user,pid}ns/<name>`.

Identity: the path. Tie: the netns pin of the same name (BesidePin; a pid pin has none, so it is
reported, never touched). Reclaimed only once that netns pin was freed this pass and no process
is in the namespace, by the netns pin's confined unmount and unlink. docs/design.md, "In depth:
the kinds".
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence

from msgspec import Struct
from msgspec.structs import asdict

from reaper.host.files import DirLister, describe_oserror
from reaper.host.mounts import unpin_hazard
from reaper.host.pins import list_pins, unpin
from reaper.host.procs import namespace_members, unseen_processes
from reaper.kinds import Found, Kind, Look, ReclaimContext, netns
from reaper.model import BesidePin, DetailValue, Done, Identity, NsKey, ResourceRef

# The namespace types CRI-O pins besides the netns, as /proc/<pid>/ns names them (pin_dir).
NS_TYPES = ("ipc", "uts", "user", "pid")
NETNS_SUBDIR = "netns"
PID_FOR_CHILDREN = "pid_for_children"  # /proc/<pid>/ns name of the pid namespace its children get


class NsPin(Struct, frozen=True, kw_only=True):
    """A file in one of CRI-O's pin dirs, normally a bind mount of a namespace of `ns_type`."""

    ns_type: str
    name: str
    path: str
    namespaces_dir: str
    ns: NsKey
    is_namespace: bool  # False: a stale plain file, no namespace mounted on it
    mtime: float

    @property
    def directory(self) -> str:
        return pin_dir(self.namespaces_dir, self.ns_type)

    @property
    def netns_path(self) -> str:
        """Where the sandbox's netns pin is, if this pin is one of a sandbox's."""
        return os.path.join(self.namespaces_dir, NETNS_SUBDIR, self.name)


def pin_dir(namespaces_dir: str, ns_type: str) -> str:
    return os.path.join(namespaces_dir, f"{ns_type}ns")


def find(look: Look) -> Found[NsPin]:
    lister = DirLister("nspins")
    pins = tuple(
        NsPin(**asdict(listed), ns_type=ns_type, namespaces_dir=namespaces_dir)
        for namespaces_dir in look.options.namespaces_dirs
        for ns_type in NS_TYPES
        for listed in list_pins(lister, pin_dir(namespaces_dir, ns_type))
    )
    return Found(pins, tuple(lister.corrupt.records()))


def identity(pin: NsPin) -> Identity:
    return ("nspins", pin.path)


def ref(pin: NsPin) -> ResourceRef:
    details: dict[str, DetailValue] = {"path": pin.path, "type": pin.ns_type}
    if not pin.is_namespace:
        details["stale"] = True
    name = f"{pin.ns_type}ns/{pin.name}"
    return ResourceRef(kind="nspins", name=name, created_at=pin.mtime, details=details, identity=identity(pin))


def tie(pin: NsPin) -> BesidePin:
    return BesidePin(pin.netns_path)


# Each type's namespaces some process is in, or why that cannot be known.
Members = Callable[[str], Mapping[NsKey, set[int]] | str]


def reclaim(pins: Sequence[NsPin], ctx: ReclaimContext) -> dict[Identity, Done]:
    why = unseen_processes() or unpin_hazard(tuple(dict.fromkeys(pin.directory for pin in pins)))
    if why is not None:
        return {identity(pin): Done.left(why) for pin in pins}

    @functools.cache
    def members(ns_type: str) -> Mapping[NsKey, set[int]] | str:
        try:
            found = namespace_members(ns_type)
            # A process that unshared a pid namespace puts its next child there: it counts.
            for ns, pids in (namespace_members(PID_FOR_CHILDREN) if ns_type == "pid" else {}).items():
                found.setdefault(ns, set()).update(pids)
            return found
        except OSError as err:
            return f"who is in its namespace cannot be seen now (the walk of /proc failed: {err})"

    return {identity(pin): _unpin(pin, ctx, members) for pin in pins}


def _unpin(pin: NsPin, ctx: ReclaimContext, members: Members) -> Done:
    if pin.ns_type not in NS_TYPES or "/" in pin.name or os.path.join(pin.directory, pin.name) != pin.path:
        return Done.left("not directly inside a namespace pin dir")
    if os.path.dirname(pin.netns_path) not in ctx.netns_dirs:
        return Done.left("its netns pin's dir is no netns dir of the reaper's")
    beside = ctx.done.get(netns.identity_at(pin.netns_path))
    if beside is None or not beside.ok:
        return Done.left("its netns pin was not reclaimed")

    def judge(key: NsKey) -> str | None:
        inside = members(pin.ns_type)
        if isinstance(inside, str):
            return inside
        pids = inside.get(key)
        return f"its {pin.ns_type} namespace is in use now (pid {min(pids)})" if pids else None

    try:
        return unpin(pin.directory, pin.name, was_namespace=pin.is_namespace, ns=pin.ns, judge=judge)
    except OSError as err:
        return Done.left(describe_oserror(err))


KIND: Kind[NsPin] = Kind(
    name="nspins",
    find=find,
    identity=identity,
    ref=ref,
    tie=tie,
    reclaim=reclaim,
    del_frees=False,
)
