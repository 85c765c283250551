"""The kernel step hands each kind the record as it was judged, not as a later look saw it."""

from __future__ import annotations

from pathlib import Path

from msgspec.structs import replace

from reaper.kinds import hostlocal
from reaper.model import Attachment, AttachmentKey
from tests.harness.passes import bare_reclaimer

DEAD, NEW = "a" * 64, "b" * 64


def test_a_lease_given_to_a_new_pod_between_the_looks_is_not_released(tmp_path: Path) -> None:
    """The orphan's lease was released by its DEL, and host-local gave the address to a new pod
    before the kernel step: the look after DEL finds a lease at the same path, naming the new
    pod. The kernel step must compare the file with the orphan's lease, and leave it."""
    net_dir = tmp_path / "ipam" / "net1"
    net_dir.mkdir(parents=True)
    lease_file = net_dir / "10.0.0.9"
    lease_file.write_bytes(f"{NEW}\r\neth0".encode())
    orphan_lease = hostlocal.collect_leases([str(tmp_path / "ipam")])[0][0]
    orphan_lease = replace(orphan_lease, container_id=DEAD)
    new_lease = replace(orphan_lease, container_id=NEW)
    ref = hostlocal.KIND.ref(orphan_lease)
    orphan = Attachment(
        key=AttachmentKey(DEAD, "net1", "eth0"),
        resources=(ref,),
        netns=None,
        verdict="orphan",
        reason="",
        age_seconds=0.0,
    )
    reclaimer = bare_reclaimer()
    identity = hostlocal.KIND.identity(orphan_lease)
    done = reclaimer._kernel([orphan], {identity: new_lease}, {}, set(), {identity: orphan_lease})
    assert not done[identity].ok and "another container" in str(done[identity].error)
    assert lease_file.read_bytes() == f"{NEW}\r\neth0".encode(), "the new pod's lease stays"
