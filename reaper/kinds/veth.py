"""Host-side veths: the half of a pod's pair left in the netns the reaper runs in.

Identity: name and ifindex (a name reused by a new link is another veth). A veth joins only
the attachment whose pinned namespace holds its peer (or the namespace a mount holds outside the
netns dirs: reaper.kinds.heldns), never one that merely names it; and it is never deleted while
its peer's namespace is a live sandbox's, in use (a process in it, a mount holding it), or
cannot be inspected.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence

from msgspec import Struct

from reaper.host.netlink import RawLink, dump_links, nsids_of
from reaper.kinds import Found, Kind, Look, ReclaimContext, delete_by_index, heldns, netns
from reaper.kinds.heldns import HeldNetns
from reaper.kinds.netns import NetnsPin
from reaper.model import DetailValue, Done, Identity, NsKey, PeerTie, ResourceRef, SourceError

UNPIN_GRACE = 2.0  # seconds the kernel gets to drop the veths of namespaces just unpinned
_POLL = 0.05


class VethLink(Struct, frozen=True, kw_only=True, gc=False):
    ifindex: int
    name: str
    peer_ifindex: int | None
    peer_netnsid: int | None
    master: str | None
    peer_netns: NsKey | None  # the pinned namespace the peer lives in, when known


def veths_from(
    links: list[RawLink], nsids: Iterable[tuple[NsKey, int]], pins: Sequence[NetnsPin], held: Iterable[NsKey] = ()
) -> list[VethLink]:
    """The veths, each tied to the namespace its peer is in: the one whose nsid (`nsids`) is the
    veth's link-netnsid, among those pinned and those a mount holds elsewhere (`held`); an nsid
    two namespaces claim ties neither (fail closed)."""
    by_index = {link.ifindex: link.name for link in links}
    pinned = {pin.ns for pin in pins if pin.is_namespace} | set(held)
    nsid_to_ns: dict[int, NsKey | None] = {}
    for ns, nsid in nsids:
        if ns in pinned:
            nsid_to_ns[nsid] = ns if nsid_to_ns.get(nsid, ns) == ns else None
    veths = []
    for link in links:
        if link.kind != "veth":
            continue
        veths.append(
            VethLink(
                ifindex=link.ifindex,
                name=link.name,
                peer_ifindex=link.link,
                peer_netnsid=link.link_netnsid,
                master=by_index.get(link.master) if link.master else None,
                peer_netns=nsid_to_ns.get(link.link_netnsid) if link.link_netnsid is not None else None,
            )
        )
    return veths


def _own_netns() -> tuple[int, int]:
    st = os.stat("/proc/self/ns/net")
    return st.st_dev, st.st_ino


def find(look: Look) -> Found[VethLink]:
    """Links, and the nsid of each pin a veth's peer may be in. The agent's memo answers a pin
    whose path and namespace stat (ctime included) are unchanged, seen from the same namespace;
    why that is safe: docs/design.md, "In depth: the kinds"."""
    pins = look.found(netns.KIND)
    held = look.found(heldns.KIND)
    memo = look.memo.of("veth")
    try:
        viewer = _own_netns()
    except OSError as err:
        return Found((), errors=(SourceError("netlink", f"cannot tell which netns this is: {err}"),))
    known: dict[str, tuple[os.stat_result, int]] = {}

    def choose_pins(links: list[RawLink]) -> list[str]:
        # Only when a veth has its peer in another namespace, and only pins not in the memo.
        if not any(link.kind == "veth" and link.link_netnsid is not None for link in links):
            return []
        ask = []
        for pin in pins:
            if not pin.is_namespace:
                continue
            try:
                st = os.stat(pin.path, follow_symlinks=False)
            except OSError:
                continue  # gone since the netns kind looked: no veth joins it
            said = memo.get(pin.path, st)
            if isinstance(said, tuple) and said[:2] == viewer:
                known[pin.path] = (st, said[2])
            else:
                ask.append(pin.path)
        return ask

    try:
        links = dump_links()
        wanted = choose_pins(links)
        asked = nsids_of(wanted) if wanted else {}
        for path, (st, nsid) in asked.items():
            memo.put(path, st, (*viewer, nsid))
            known[path] = (st, nsid)
        known.update(_held_nsids(links, held, {nsid for _, nsid in known.values()}))
    except OSError as err:
        return Found((), errors=(SourceError("netlink", str(err)),))
    nsids = [(NsKey(st.st_dev, st.st_ino), nsid) for st, nsid in known.values()]
    return Found(tuple(veths_from(links, nsids, pins, (record.ns for record in held))))


def _held_nsids(
    links: list[RawLink], held: Sequence[HeldNetns], known: set[int]
) -> dict[str, tuple[os.stat_result, int]]:
    """The nsids of the namespaces mounts hold elsewhere, asked only when some veth's peer is in
    a namespace no pin's nsid names, each through its holder's root (a mount whose path crosses
    local filesystems alone: reaper.host.nsmounts); never remembered (no pin to key a memo)."""
    unnamed = (link.link_netnsid for link in links if link.kind == "veth")
    if not any(nsid is not None and nsid not in known for nsid in unnamed):
        return {}
    paths = [next((m.reach for m in record.mounts if m.reachable), "") for record in held]
    wanted = [path for path in paths if path]
    return nsids_of(wanted) if wanted else {}


def identity(veth: VethLink) -> Identity:
    return ("veth", veth.name, str(veth.ifindex))


def ref(veth: VethLink) -> ResourceRef:
    details: dict[str, DetailValue] = {
        "ifindex": veth.ifindex,
        "peer_ifindex": veth.peer_ifindex,
        "peer_netnsid": veth.peer_netnsid,
    }
    if veth.master:
        details["master"] = veth.master
    return ResourceRef(kind="veth", name=veth.name, created_at=None, details=details, identity=identity(veth))


def tie(veth: VethLink) -> PeerTie:
    return PeerTie(veth.name, veth.peer_netns)


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
    """Delete host veths still there after their pin went (their namespace kept by an open fd,
    say), each only while its index has the same name, kind and peer, and its peer's namespace
    may go (_peer_in_use)."""
    if not veths:
        return {}
    if netns.unpinned_any(ctx.done):
        _wait_gone({v.ifindex for v in veths}, UNPIN_GRACE)
    by_index = {link.ifindex: link for link in dump_links()}
    busy = ctx.busy()

    def changed(veth: VethLink, link: RawLink) -> bool:
        return link.kind != "veth" or link.name != veth.name or link.link_netnsid != veth.peer_netnsid

    return delete_by_index(veths, by_index, identity, changed, lambda veth: _peer_in_use(veth, ctx, busy))


def host_ifname(veth: VethLink) -> str:
    return veth.name


def keeps_netns(veth: VethLink) -> NsKey | None:
    """The namespace the peer lives in: deleting the host veth deletes the peer and the pod's
    address on it; while the veth stays, so does the peer's address."""
    return veth.peer_netns


def proves(veth: VethLink, netns: NsKey | None) -> bool:
    return veth.peer_netns is not None and veth.peer_netns == netns


KIND: Kind[VethLink] = Kind(
    name="veth",
    find=find,
    identity=identity,
    ref=ref,
    tie=tie,
    reclaim=reclaim,
    del_needs=True,
    proves=proves,
    keeps_netns=keeps_netns,
)
