"""IFB devices of the bandwidth plugin, in the netns the reaper runs in.

The bandwidth meta plugin (containernetworking/plugins, plugins/meta/bandwidth) shapes a pod's
egress through an IFB device: the host veth's ingress is redirected to it, and a tbf qdisc on
it does the shaping. It names the device `bwp` + the first 12 hex digits of SHA-512(network
name + container ID), the same in every release from v1.0.0 to v1.9.1, and its DEL deletes the
device by that name. When no DEL runs, the IFB stays: unlike the veth (whose qdiscs go with it),
it lives in no pod namespace.

Identity: name and ifindex (a name reused by a new link is another device). Only links of kind
`ifb` named exactly `bwp` + 12 lowercase hex digits are records. Tie: the name is the key, a
Claim: a device joins the attachment whose network and container ID hash to its name
(`ifb_name`), one that other resources make; a device matching no attachment is unconfirmed
and never reclaimed. Reclaimed by index, only while that index still is an ifb of the same
name; its qdiscs go with it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

from msgspec import Struct

from reaper.host.netlink import RawLink, delete_links, dump_links_of_kind
from reaper.kinds import Found, Kind, Look, ReclaimContext
from reaper.model import Claim, Done, Identity, ResourceRef, SourceError

LINK_KIND = "ifb"
PREFIX = "bwp"
NAME_LENGTH = 15  # the plugin's maxIfbDeviceLength: IFNAMSIZ - 1
IFB_NAME = re.compile(r"bwp[0-9a-f]{12}")


class IfbDevice(Struct, frozen=True):
    """An IFB device named as the bandwidth plugin names its own."""

    ifindex: int
    name: str

    @property
    def key(self) -> str:
        """The producer's key of its attachment: the name itself (see `ifb_name`)."""
        return self.name


def ifb_name(network: str, container_id: str) -> str:
    """The name the bandwidth plugin gives an attachment's IFB: `bwp`, then SHA-512 of the
    network name and the container ID (concatenated, UTF-8) in lowercase hex, cut at 15."""
    return (PREFIX + hashlib.sha512((network + container_id).encode()).hexdigest())[:NAME_LENGTH]


def _key_of(container_id: str, network: str, ifname: str) -> str:
    return ifb_name(network, container_id)  # the plugin's name ignores the ifname


def ifbs_from(links: Iterable[RawLink]) -> list[IfbDevice]:
    """The links that are the bandwidth plugin's IFBs by kind and name; no other link is."""
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
    return ResourceRef(
        kind="ifb", name=device.name, created_at=None, details={"ifindex": device.ifindex}, identity=identity(device)
    )


def tie(device: IfbDevice) -> Claim:
    return Claim(key=device.key)


# ------------------------------------------------------------------------------ reclaiming


def reclaim(devices: Sequence[IfbDevice], ctx: ReclaimContext) -> dict[Identity, Done]:
    """Delete each IFB by its index, only while that index still is an ifb of the same name
    (read again with the same reader the look used); the kernel drops its qdiscs with it."""
    if not devices:
        return {}
    now = {link.ifindex: link for link in dump_links_of_kind(LINK_KIND)}
    done: dict[Identity, Done] = {}
    to_delete: dict[int, IfbDevice] = {}
    for device in devices:
        link = now.get(device.ifindex)
        if link is None:
            done[identity(device)] = Done.freed()  # no ifb has that index any more
        elif link.kind != LINK_KIND or link.name != device.name:
            done[identity(device)] = Done.left("index now belongs to another link; left alone")
        else:
            to_delete[device.ifindex] = device
    for index, error in delete_links(list(to_delete)).items() if to_delete else ():
        done[identity(to_delete[index])] = Done.freed() if error is None else Done.left(error)
    return done


KIND: Kind[IfbDevice] = Kind(
    name="ifb", find=find, identity=identity, ref=ref, tie=tie, reclaim=reclaim, key_of=_key_of
)
