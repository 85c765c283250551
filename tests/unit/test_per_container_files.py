"""flannel's and multus' per-container files in attachments: each joins its container's, shares
its verdict, and is reclaimed after the rest of it (it is what a DEL of the plugin's needs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from reaper.host.memo import InventoryMemo
from reaper.kinds import Look, flannel, multus
from reaper.kinds.flannel import FlannelDelegate, FlannelFile
from reaper.kinds.hostlocal import collect_leases
from reaper.kinds.registry import REGISTRY
from reaper.model import NodeSnapshot, ScanReport
from reaper.options import FindOptions
from reaper.reap.plan import plan_attachment
from tests.harness.passes import bare_reclaimer, confirmed, verdicts_and_kinds, with_records
from tests.harness.plugin_files import FLANNEL_CONF, flannel_scratch, multus_pod_scratch
from tests.harness.snapshots import NET, NOW, OLD, POLICY, cache, cid, lease, pin, sandbox, snapshot


def _flannel(n: int, mtime: float = OLD) -> FlannelFile:
    path = f"/var/lib/cni/flannel/{cid(n)}"
    return FlannelFile(
        container_id=cid(n),
        path=path,
        root="/var/lib/cni",
        mtime=mtime,
        stamp=(1, n, 1, 1, 1),
        content=FlannelDelegate(NET, "bridge"),
    )


def _twice(snap: NodeSnapshot, *sandboxes: Any) -> ScanReport:
    return confirmed(snap, POLICY, NOW, *sandboxes)


def test_a_dead_containers_flannel_file_joins_its_lease_and_pin() -> None:
    """The pin joins by the netns the cache entry names (the runtime lists the sandbox no more)."""
    snap = with_records(
        snapshot(pins=(pin(1, OLD),), leases=(lease(1, OLD),), caches=(cache(1, OLD),)), flannel=(_flannel(1),)
    )
    report = _twice(snap)
    assert verdicts_and_kinds(report) == {cid(1): ("orphan", ["cache", "flannel", "ipam", "netns"])}
    (attachment,) = report.attachments
    assert (attachment.key.network, attachment.key.ifname) == (NET, "eth0")


def test_a_live_containers_file_is_live() -> None:
    snap = with_records(snapshot(pins=(pin(1, OLD),), leases=(lease(1, OLD),)), flannel=(_flannel(1), _flannel(2)))
    report = _twice(snap, sandbox(1), sandbox(2, with_netns=False))
    assert verdicts_and_kinds(report) == {cid(1): ("live", ["flannel", "ipam", "netns"]), cid(2): ("live", ["flannel"])}


def test_a_lone_file_of_a_dead_container_is_an_attachment_of_its_own() -> None:
    report = _twice(with_records(snapshot(), flannel=(_flannel(3),)))
    (attachment,) = report.attachments
    assert (attachment.key.container_id, attachment.key.network, attachment.key.ifname) == (cid(3), None, None)
    assert attachment.verdict == "orphan"
    young = _twice(with_records(snapshot(), flannel=(_flannel(3, NOW - 30),)))
    assert young.attachments[0].verdict == "pending", "flannel writes it before its delegate runs"


def test_the_files_are_reclaimed_after_the_rest_and_before_the_cache_entry() -> None:
    order = [k.name for k in REGISTRY.reclaim_order]
    assert order.index("flannel") > max(order.index(k) for k in ("netns", "veth", "ipam", "iptables", "nft"))
    assert order[-3:] == ["flannel", "multus", "cache"]
    assert {"flannel", "multus"} <= REGISTRY.quarantinable and all(
        k.last for k in REGISTRY.kinds if k.name in ("flannel", "multus")
    )
    snap = with_records(snapshot(leases=(lease(1, OLD),)), flannel=(_flannel(1),))
    (attachment,) = _twice(snap).attachments
    steps = plan_attachment(attachment, None, None, quarantine=True).steps
    assert {(s.kind, s.method) for s in steps} == {("flannel", "quarantine"), ("ipam", "quarantine")}


def _node(tmp_path: Path) -> tuple[NodeSnapshot, Path, list[Path]]:
    """One dead container's lease, flannel file and multus file, on disk."""
    net_dir = tmp_path / "ipam" / NET
    net_dir.mkdir(parents=True)
    lease_file = net_dir / "10.0.0.2"
    lease_file.write_bytes(f"{cid(1)}\r\neth0".encode())
    files = []
    for sub, data in (("flannel", flannel_scratch(FLANNEL_CONF)), ("multus", multus_pod_scratch())):
        (tmp_path / "cni" / sub).mkdir(parents=True)
        files.append(tmp_path / "cni" / sub / cid(1))
        files[-1].write_bytes(data)
    options = FindOptions(
        netns_dirs=(),
        ipam_dirs=(),
        cache_dir=str(tmp_path / "cni"),
        conf_dir=str(tmp_path / "none"),
        bin_dirs=(),
        netns_patterns=(re.compile("x"),),
    )
    look = Look(options, InventoryMemo(), (), {})
    leases, _ = collect_leases([str(tmp_path / "ipam")])
    snap = with_records(
        snapshot(leases=tuple(replace(x, mtime=OLD) for x in leases)),
        flannel=flannel.find(look).records,
        multus=multus.find(look).records,
    )
    return snap, lease_file, files


def _present(snap: NodeSnapshot) -> dict[tuple[str, ...], Any]:
    return {kind.identity(r): r for kind in REGISTRY.kinds for r in snap.of(kind.name)}


def test_the_files_go_once_the_rest_of_the_attachment_is_gone(tmp_path: Path) -> None:
    snap, lease_file, files = _node(tmp_path)
    (attachment,) = _twice(snap).attachments
    assert sorted(r.kind for r in attachment.resources) == ["flannel", "ipam", "multus"]
    done = bare_reclaimer()._kernel([attachment], _present(snap), {}, set(), _present(snap))
    assert len(done) == 3 and all(d.ok for d in done.values())
    assert not lease_file.exists() and not any(f.exists() for f in files)


def test_the_files_stay_while_the_rest_of_the_attachment_does(tmp_path: Path) -> None:
    """The lease names another container by now, so it stays: so do the files its DEL needs."""
    snap, lease_file, files = _node(tmp_path)
    (attachment,) = _twice(snap).attachments
    lease_file.write_bytes(f"{cid(9)}\r\neth0".encode())
    done = bare_reclaimer()._kernel([attachment], _present(snap), {}, set(), _present(snap))
    kept = {key[0]: d for key, d in done.items()}
    assert not kept["ipam"].ok and "another container" in str(kept["ipam"].error)
    for kind in ("flannel", "multus"):
        assert not kept[kind].ok and "other resources of the attachment remain" in str(kept[kind].error)
    assert lease_file.exists() and all(f.exists() for f in files)
