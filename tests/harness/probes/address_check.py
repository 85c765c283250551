"""The address check for one orphan holding 10.9.0.5, in an address space bounded to what it
holds once loaded plus HEADROOM_MIB, with the message bound lowered to half of COUNT. Usage:
address_check COUNT HEADROOM_MIB; run where this PID namespace is the node. Prints what was
left, as JSON."""

from __future__ import annotations

import json
import resource
import sys

from reaper.host import netns_addrs
from reaper.kinds import hostlocal
from reaper.kinds.hostlocal import HostLocalLease
from reaper.model import Attachment, AttachmentKey
from reaper.reap import addresses


def no_unseen_processes(proc: str = "/proc") -> str | None:
    """This PID namespace is the node: it is the host's as far as the check is concerned."""
    return None


def main(count: int, headroom_mib: int) -> None:
    vars(addresses)["unseen_processes"] = no_unseen_processes  # the name the check calls
    netns_addrs.MAX_ADDRESS_MESSAGES = count // 2
    lease = HostLocalLease(
        network="net1",
        ip="10.9.0.5",
        container_id="d" * 64,
        ifname="eth0",
        path="/nonexistent",
        data_dir="/nonexistent",
        mtime=0.0,
    )
    orphan = Attachment(
        key=AttachmentKey("d" * 64, "net1", "eth0"),
        resources=(hostlocal.KIND.ref(lease),),
        netns=None,
        verdict="orphan",
        reason="",
        age_seconds=1e6,
    )
    records = {hostlocal.KIND.identity(lease): lease}
    addresses.addresses_in_use([orphan], records, ("/nonexistent",), deadline=0.0)  # everything loaded once
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + headroom_mib * 1024 * 1024, resource.RLIM_INFINITY))
    left = addresses.addresses_in_use([orphan], records, ("/nonexistent",), deadline=120.0)
    print(json.dumps({"left": list(left.values())}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
