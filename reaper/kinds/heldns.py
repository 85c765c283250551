"""Network namespaces held by a mount outside the netns dirs, in any mount namespace.

Such a namespace outlives its pin, with its veths and addresses (containerd#3667, moby#27277,
cri-o#4210). The reaper never unmounts it: a record here holds its namespace (`holds`), so its
attachment is live and the host veth whose peer is there is tied to it. Identity: the
namespace. A walk that cannot be whole is this kind's error, and then no attachment with a
namespace is decided (reaper.reconcile). Found by reaper.host.nsmounts.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from reaper.host.nsmounts import NsMount, ParsedMountinfo, held_mounts
from reaper.kinds import Found, Kind, Look, ReclaimContext
from reaper.model import DetailValue, Done, HeldTie, Identity, NsKey, ResourceRef, SourceError
from reaper.state import is_netns_path

NAME = "heldns"
SHOWN = 4  # mounts named in a report's details; the rest are counted


class HeldNetns(Struct, frozen=True):
    """A network namespace mounted outside the netns dirs, and the mounts that hold it."""

    ns: NsKey
    mounts: tuple[NsMount, ...]

    @property
    def path(self) -> str:
        """A path to it through its first holder (how the report and the state file name it)."""
        first = self.mounts[0]
        return first.reach if is_netns_path(first.reach) else f"/proc/{first.pid}/ns/net"

    def why(self) -> str:
        more = len(self.mounts) - 1
        also = f", and {more} more mount{'s' if more > 1 else ''}" if more else ""
        return f"its netns is held by {self.mounts[0].describe()}{also}; never unmounted by the reaper"


def find(look: Look) -> Found[HeldNetns]:
    # The agent's memo keeps what each mountinfo text parsed to: most are the same every pass.
    parsed = look.memo.kept(NAME, ParsedMountinfo)
    try:
        held = held_mounts(look.options.netns_dirs, parsed=parsed).held
    except OSError as err:
        return Found((), errors=(SourceError(NAME, f"the mounts of every mount namespace cannot be read: {err}"),))
    return Found(tuple(HeldNetns(ns, found) for ns, found in sorted(held.items())))


def identity(held: HeldNetns) -> Identity:
    return (NAME, str(held.ns.dev), str(held.ns.ino))


def ref(held: HeldNetns) -> ResourceRef:
    details: dict[str, DetailValue] = {}
    for n, mount in enumerate(held.mounts[:SHOWN]):
        suffix = "" if n == 0 else f"_{n + 1}"
        details[f"pid{suffix}"] = mount.pid
        details[f"mount_ns{suffix}"] = f"mnt:[{mount.mount_ns}]"
        details[f"mount_point{suffix}"] = mount.mount_point
    if len(held.mounts) > SHOWN:
        details["more_mounts"] = len(held.mounts) - SHOWN
    name = f"net:[{held.ns.ino}]"
    return ResourceRef(kind=NAME, name=name, created_at=None, details=details, identity=identity(held))


def tie(held: HeldNetns) -> HeldTie:
    return HeldTie(held.ns, held.path)


def reclaim(records: Sequence[HeldNetns], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Nothing: a mount outside the netns dirs is never the reaper's to unmount."""
    return {identity(r): Done.left(r.why()) for r in records}


def holds(held: HeldNetns) -> tuple[NsKey, str]:
    return held.ns, held.why()


KIND: Kind[HeldNetns] = Kind(name=NAME, find=find, identity=identity, ref=ref, tie=tie, reclaim=reclaim)
