"""Host-side veths: the half of a pod's pair left in the netns the reaper runs in.

Identity: name and ifindex (a name reused by a new link is another veth). A veth joins only
the attachment whose pinned namespace holds its peer, never one that merely names it; and it is
never deleted while its peer's namespace is a live sandbox's, in use, or cannot be inspected.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from reaper.host.netlink import RawLink, delete_links, dump_links, dump_links_and_nsids
from reaper.host.procs import busy_namespaces
from reaper.kinds import Found, Kind, Look, ReclaimContext
from reaper.model import DetailValue, Done, Identity, NetnsPin, NsKey, PeerTie, ResourceRef, SourceError, VethLink

UNPIN_GRACE = 2.0  # seconds the kernel gets to drop the veths of namespaces just unpinned
_POLL = 0.05


def veths_from(links: list[RawLink], nsids: dict[str, int], pins: Sequence[NetnsPin]) -> list[VethLink]:
    by_index = {link.ifindex: link.name for link in links}
    pin_ns = {pin.path: pin.ns for pin in pins}
    nsid_to_ns = {nsid: pin_ns[path] for path, nsid in nsids.items() if path in pin_ns}
    veths = []
    for link in links:
        if link.kind != "veth":
            continue
        peer_ns = nsid_to_ns.get(link.link_netnsid) if link.link_netnsid is not None else None
        veths.append(
            VethLink(
                ifindex=link.ifindex,
                name=link.name,
                peer_ifindex=link.link,
                peer_netnsid=link.link_netnsid,
                master=by_index.get(link.master) if link.master else None,
                peer_netns=peer_ns,
            )
        )
    return veths


def find(look: Look) -> Found[VethLink]:
    pins: tuple[NetnsPin, ...] = look.earlier.get("netns", ())
    real_pins = [pin.path for pin in pins if pin.is_namespace]

    def choose_pins(links: list[RawLink]) -> list[str]:
        # Finding where each peer lives costs a netlink request per pin: only when a veth has
        # its peer in another namespace.
        return real_pins if any(link.kind == "veth" and link.link_netnsid is not None for link in links) else []

    try:
        links, nsids = dump_links_and_nsids(choose_pins)
    except OSError as err:
        return Found((), errors=(SourceError("netlink", str(err)),))
    return Found(tuple(veths_from(links, nsids, pins)))


def identity(veth: VethLink) -> Identity:
    return ("veth", veth.name, str(veth.ifindex))


def ref(veth: VethLink) -> ResourceRef:
    details: tuple[tuple[str, DetailValue], ...] = (
        ("ifindex", veth.ifindex),
        ("peer_ifindex", veth.peer_ifindex),
        ("peer_netnsid", veth.peer_netnsid),
    )
    if veth.master:
        details += (("master", veth.master),)
    return ResourceRef("veth", veth.name, None, details, identity(veth))


def tie(veth: VethLink) -> PeerTie:
    return PeerTie(veth.name, veth.peer_netns)


# ------------------------------------------------------------------------------ reclaiming


def _wait_gone(indexes: set[int], timeout: float) -> None:
    """Veths die shortly after their namespace; give the kernel a moment."""
    deadline = time.monotonic() + timeout
    left = set(indexes)
    while left:
        left &= {link.ifindex for link in dump_links()}
        if not left or time.monotonic() > deadline:
            return
        time.sleep(_POLL)


def _peer_in_use(veth: VethLink, ctx: ReclaimContext, busy: Mapping[NsKey, str]) -> str | None:
    """Why deleting this veth would cut a namespace someone still uses, if it would."""
    if veth.peer_netns is None:
        return "its peer's namespace cannot be inspected; left alone"
    if veth.peer_netns in ctx.live_netns:
        return "its peer is in a live sandbox's namespace; left alone"
    if veth.peer_netns in busy:
        return f"its peer's namespace is in use: {busy[veth.peer_netns]}; left alone"
    return None


def reclaim(veths: Sequence[VethLink], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Delete host veths still there after their pin went (their namespace kept by a mount
    elsewhere), each only if its index still has the same name, kind and peer, and never while
    its peer's namespace is a live sandbox's, has a process in it, or cannot be inspected."""
    if not veths:
        return {}
    if any(ident[0] == "netns" and done.ok for ident, done in ctx.done.items()):
        _wait_gone({v.ifindex for v in veths}, UNPIN_GRACE)
    by_index = {link.ifindex: link for link in dump_links()}
    busy = busy_namespaces(ctx.bin_dirs)
    done: dict[Identity, Done] = {}
    to_delete: dict[int, VethLink] = {}
    for veth in veths:
        link = by_index.get(veth.ifindex)
        why = _peer_in_use(veth, ctx, busy)
        if link is None:
            done[identity(veth)] = Done.freed()  # gone with its namespace
        elif link.kind != "veth" or link.name != veth.name or link.link_netnsid != veth.peer_netnsid:
            done[identity(veth)] = Done.left("index now belongs to another link; left alone")
        elif why is not None:
            done[identity(veth)] = Done.left(why)
        else:
            to_delete[veth.ifindex] = veth
    for index, error in delete_links(list(to_delete)).items() if to_delete else ():
        done[identity(to_delete[index])] = Done.freed() if error is None else Done.left(error)
    return done


KIND: Kind[VethLink] = Kind("veth", find, identity, ref, tie, reclaim)
