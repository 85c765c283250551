"""An orphan whose one resource is a host-local lease, for the benches of the address check."""

from __future__ import annotations

from reaper.kinds import hostlocal
from reaper.kinds.hostlocal import HostLocalLease
from reaper.model import Attachment, AttachmentKey


def orphan_leasing(address: str, container_id: str) -> tuple[Attachment, HostLocalLease]:
    """The orphan (network net1, eth0) and its lease of `address`; the lease's file is nowhere."""
    lease = HostLocalLease(
        network="net1",
        ip=address,
        container_id=container_id,
        ifname="eth0",
        path=f"/nonexistent/{address}",
        data_dir="/nonexistent",
        mtime=0.0,
    )
    orphan = Attachment(
        key=AttachmentKey(container_id, "net1", "eth0"),
        resources=(hostlocal.ref(lease),),
        netns=None,
        verdict="orphan",
        reason="",
        age_seconds=600.0,
    )
    return orphan, lease
