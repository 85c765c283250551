"""IFB devices of the bandwidth plugin (`ifb_name`), in the netns the reaper runs in.

Only links of kind `ifb` named exactly so are records. Identity: name and ifindex. Tie: a Claim
by the name, so a device matching no attachment is unconfirmed, never reclaimed. Why they leak:
docs/design.md, "In depth: the kinds".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

from msgspec import Struct

from reaper.host.netlink import RawLink, dump_links_of_kind
from reaper.kinds import Found, Kind, Look, ReclaimContext, delete_by_index
from reaper.model import Claim, DetailValue, Done, Identity, ResourceRef, SourceError

LINK_KIND = "ifb"
PREFIX = "bwp"
NAME_LENGTH = 15  # the plugin's maxIfbDeviceLength: IFNAMSIZ - 1
IFB_NAME = re.compile(r"bwp[0-9a-f]{12}")


class IfbDevice(Struct, frozen=True):
    ifindex: int
    name: str  # the producer's key of its attachment (see `ifb_name`)


def ifb_name(network: str, container_id: str) -> str:
    """The name the bandwidth plugin gives an attachment's IFB."""
    return (PREFIX + hashlib.sha512((network + container_id).encode()).hexdigest())[:NAME_LENGTH]


def ifbs_from(links: Iterable[RawLink]) -> list[IfbDevice]:
    return [
        IfbDevice(link.ifindex, link.name)
        for link in links
        if link.kind == LINK_KIND and IFB_NAME.fullmatch(link.name) is not None
    ]


def find(look: Look) -> Found[IfbDevice]:
    try:
        links = dump_links_of_kind(LINK_KIND)
    except OSError as err:
        return Found((), errors=(SourceError("netlink", str(err)),))
    return Found(tuple(ifbs_from(links)))


def identity(device: IfbDevice) -> Identity:
    return ("ifb", device.name, str(device.ifindex))


def ref(device: IfbDevice) -> ResourceRef:
    details: dict[str, DetailValue] = {"ifindex": device.ifindex}
    return ResourceRef(kind="ifb", name=device.name, created_at=None, details=details, identity=identity(device))


def tie(device: IfbDevice) -> Claim:
    return Claim(key=device.name)


def reclaim(devices: Sequence[IfbDevice], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Delete each IFB by its index, only while that index still is an ifb of the same name
    (read again with the same reader the look used); the kernel drops its qdiscs with it."""
    if not devices:
        return {}
    now = {link.ifindex: link for link in dump_links_of_kind(LINK_KIND)}

    def changed(device: IfbDevice, link: RawLink) -> bool:
        return link.kind != LINK_KIND or link.name != device.name

    return delete_by_index(devices, now, identity, changed)


KIND: Kind[IfbDevice] = Kind(
    name="ifb",
    find=find,
    identity=identity,
    ref=ref,
    tie=tie,
    reclaim=reclaim,
    key_of=lambda container_id, network, ifname: ifb_name(network, container_id),  # the name ignores the ifname
)
