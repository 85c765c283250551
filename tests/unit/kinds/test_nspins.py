"""CRI-O's other namespace pins: found only in CRI-O's namespaces_dir, joined to the netns pin
of the same name, reported when there is none, and reclaimed only after that netns pin and
only when no process is in the namespace."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper.correlate import correlate
from reaper.host.memo import InventoryMemo
from reaper.host.pins import Judge
from reaper.kinds import Look, ReclaimContext, netns, nspins
from reaper.kinds.netns import NetnsPin
from reaper.kinds.nspins import NsPin
from reaper.layout import Layout, RuntimeLayout
from reaper.model import BesidePin, Done, Identity, NsKey, Sandbox
from reaper.options import FindOptions
from reaper.settings import settings_from
from tests.harness.snapshots import runtime, snapshot

UUID = "0b7c2e1e-6d55-4f4b-9c1e-3a2f0e9d8c7b"
NSDIR = "/var/run"


def options(namespaces_dirs: tuple[str, ...], netns_dirs: tuple[str, ...] = ()) -> FindOptions:
    return FindOptions(
        netns_dirs=netns_dirs,
        ipam_dirs=(),
        cache_dir="/nonexistent",
        conf_dir="/nonexistent",
        bin_dirs=(),
        netns_patterns=(re.compile("x"),),
        namespaces_dirs=namespaces_dirs,
    )


def nspin(ns_type: str, name: str = UUID, ino: int = 5000, namespaces_dir: str = NSDIR) -> NsPin:
    return NsPin(
        ns_type=ns_type,
        name=name,
        path=f"{namespaces_dir}/{ns_type}ns/{name}",
        namespaces_dir=namespaces_dir,
        ns=NsKey(4, ino),
        is_namespace=True,
        mtime=0.0,
    )


def netns_pin(name: str = UUID, ino: int = 1001) -> NetnsPin:
    return NetnsPin(
        name=name,
        path=f"{NSDIR}/netns/{name}",
        directory=f"{NSDIR}/netns",
        ns=NsKey(4, ino),
        is_namespace=True,
        mtime=0.0,
        runtime_named=True,
    )


def context(done: Mapping[Identity, Done]) -> ReclaimContext:
    return ReclaimContext(
        netns_dirs=(f"{NSDIR}/netns",),
        bin_dirs=(),
        live_netns=frozenset(),
        quarantine=None,
        command_timeout=1.0,
        done=done,
    )


def test_find_lists_each_type_dir_of_a_namespaces_dir_and_nothing_without_one(tmp_path: Path) -> None:
    for ns_type in ("ipc", "uts", "user", "pid", "net", "cgroup"):
        (tmp_path / f"{ns_type}ns").mkdir()
        (tmp_path / f"{ns_type}ns" / UUID).touch()
    (tmp_path / "ipcns" / "link").symlink_to(tmp_path / "utsns" / UUID)
    look = Look(options((str(tmp_path),)), InventoryMemo(), (), {})
    found = nspins.find(look)
    assert sorted(p.ns_type for p in found.records) == ["ipc", "pid", "user", "uts"]
    assert all(not p.is_namespace and p.name == UUID for p in found.records)
    assert [c.path for c in found.corrupt] == [str(tmp_path / "ipcns" / "link")]
    assert nspins.find(Look(options(()), InventoryMemo(), (), {})).records == ()


def test_a_pin_ties_to_the_netns_pin_of_its_name() -> None:
    pin = nspin("ipc")
    assert nspins.tie(pin) == BesidePin(f"{NSDIR}/netns/{UUID}")
    ref = nspins.KIND.ref(pin)
    assert ref.kind == "nspins" and ref.identity == nspins.identity(pin) and ref.name == f"ipcns/{UUID}"


def test_pins_join_their_netns_pins_attachment_and_one_without_a_netns_pin_is_unconfirmed() -> None:
    base = snapshot(pins=(netns_pin(),))
    others = (nspin("ipc"), nspin("uts", ino=5001), nspin("pid", name="pid123456", ino=5002))
    snap = replace(base, resources={**base.resources, "nspins": others})
    result = correlate(snap, runtime())
    [group] = result.groups
    assert sorted(r.kind for r in group.resources) == ["netns", "nspins", "nspins"]
    assert group.netns == NsKey(4, 1001)
    [alone] = result.unconfirmed
    assert alone.resource.name == "pidns/pid123456" and "no netns pin beside it" in alone.why


@pytest.fixture
def unpinned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pins the kind would unmount, with every process seen and no namespace in use."""
    calls: list[str] = []

    def fake_unpin(directory: str, name: str, *, was_namespace: bool, ns: NsKey, judge: Judge) -> Done:
        why = judge(ns)
        if why is not None:
            return Done.left(why)
        calls.append(os.path.join(directory, name))
        return Done.freed()

    monkeypatch.setattr(nspins, "unseen_processes", lambda: None)
    monkeypatch.setattr(nspins, "unpin_hazard", lambda dirs: None)
    monkeypatch.setattr(nspins, "namespace_members", lambda ns_type: {NsKey(4, 7000): {42}})
    monkeypatch.setattr(nspins, "unpin", fake_unpin)
    return calls


def test_a_pin_is_reclaimed_only_once_its_netns_pin_was(unpinned: list[str]) -> None:
    pin = nspin("uts")
    freed = {netns.identity_at(pin.netns_path): Done.freed()}
    left = {netns.identity_at(pin.netns_path): Done.left("busy")}
    assert nspins.reclaim([pin], context({})) == {nspins.identity(pin): Done.left("its netns pin was not reclaimed")}
    assert not nspins.reclaim([pin], context(left))[nspins.identity(pin)].ok
    assert unpinned == []
    assert nspins.reclaim([pin], context(freed))[nspins.identity(pin)].ok
    assert unpinned == [pin.path]


def test_a_namespace_a_process_is_in_stays(unpinned: list[str]) -> None:
    pin = nspin("ipc", ino=7000)
    done = nspins.reclaim([pin], context({netns.identity_at(pin.netns_path): Done.freed()}))
    assert done[nspins.identity(pin)] == Done.left("its ipc namespace is in use now (pid 42)")
    assert unpinned == []


def test_a_pid_namespace_a_process_will_fork_into_stays(unpinned: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pin = nspin("pid", ino=7001)

    def members(ns_type: str) -> dict[NsKey, set[int]]:
        return {NsKey(4, 7001): {43}} if ns_type == "pid_for_children" else {}

    monkeypatch.setattr(nspins, "namespace_members", members)
    done = nspins.reclaim([pin], context({netns.identity_at(pin.netns_path): Done.freed()}))
    assert done[nspins.identity(pin)] == Done.left("its pid namespace is in use now (pid 43)")
    assert unpinned == []


def test_pins_of_a_listed_sandbox_join_its_live_attachment() -> None:
    base = snapshot(pins=(netns_pin(),))
    snap = replace(base, resources={**base.resources, "nspins": (nspin("ipc"),)})
    listed = Sandbox(
        id="a" * 64,
        name="pod",
        namespace="default",
        uid="uid",
        ready=True,
        created_at=0.0,
        netns_path=f"{NSDIR}/netns/{UUID}",
        netns=NsKey(4, 1001),
    )
    [group] = correlate(snap, runtime(listed)).groups
    assert group.key.container_id == "a" * 64
    assert sorted(r.kind for r in group.resources) == ["netns", "nspins"]


def test_a_pin_outside_the_reapers_netns_dirs_or_of_another_type_stays(unpinned: list[str]) -> None:
    elsewhere = nspin("ipc", namespaces_dir="/elsewhere")
    odd = nspin("mnt")
    done = {netns.identity_at(p.netns_path): Done.freed() for p in (elsewhere, odd)}
    result = nspins.reclaim([elsewhere, odd], context(done))
    assert not result[nspins.identity(elsewhere)].ok and not result[nspins.identity(odd)].ok
    assert unpinned == []


def test_without_the_host_pid_namespace_or_a_whole_walk_nothing_goes(
    unpinned: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pin = nspin("pid")
    ctx = context({netns.identity_at(pin.netns_path): Done.freed()})
    monkeypatch.setattr(nspins, "unseen_processes", lambda: "not in the host's PID namespace")
    assert nspins.reclaim([pin], ctx) == {nspins.identity(pin): Done.left("not in the host's PID namespace")}
    monkeypatch.setattr(nspins, "unseen_processes", lambda: None)

    def fails(ns_type: str) -> dict[NsKey, set[int]]:
        raise OSError(5, "no /proc")

    monkeypatch.setattr(nspins, "namespace_members", fails)
    result = nspins.reclaim([pin], ctx)[nspins.identity(pin)]
    assert not result.ok and "cannot be seen" in (result.error or "")
    assert unpinned == []


def test_only_crio_says_where_its_namespaces_dir_is_unless_the_operator_does() -> None:
    def runtime_layout(name: str, netns_dir: str) -> RuntimeLayout:
        return RuntimeLayout(
            runtime=name,
            conf_dir="/etc/cni/net.d",
            bin_dirs=("/opt/cni/bin",),
            netns_dir=netns_dir,
            sources=(),
            socket="/x.sock",
            serving=True,
        )

    args = argparse.Namespace()
    both = Layout((runtime_layout("containerd", "/var/run/netns"), runtime_layout("cri-o", "/run/crio/ns/netns")))
    assert settings_from(args, {}, both).find.namespaces_dirs == ("/run/crio/ns",)
    assert settings_from(args, {}, Layout((runtime_layout("containerd", "/var/run/netns"),))).find.namespaces_dirs == ()
    assert settings_from(args, {}).find.namespaces_dirs == ()
    flagged = argparse.Namespace(namespaces_dir=["/srv/ns"])
    assert settings_from(flagged, {}, both).find.namespaces_dirs == ("/srv/ns",)
    assert settings_from(args, {"REAPER_NAMESPACES_DIR": "/a:/b"}, both).find.namespaces_dirs == ("/a", "/b")
