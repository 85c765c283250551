"""The compare-before-delete rules of each kind's own reclaim, on real files, pins and processes."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.host import pins as pins_module
from reaper.host.files import NSFS_MAGIC, fs_type, namespace_of
from reaper.host.quarantine import Quarantine
from reaper.kinds import ReclaimContext, cache, hostlocal, netns
from reaper.kinds.cache import CacheEntry
from reaper.kinds.hostlocal import HostLocalLease
from reaper.kinds.netns import NetnsPin
from reaper.model import Done, NsKey
from tests.harness.lab.kernel import umount
from tests.harness.probe import probe_argv
from tests.harness.probes import gone_chain

CID = "c" * 64


def context(
    netns_dirs: Path, live: frozenset[NsKey] = frozenset(), quarantine: Quarantine | None = None
) -> ReclaimContext:
    return ReclaimContext(
        netns_dirs=(str(netns_dirs),),
        bin_dirs=(),
        live_netns=live,
        quarantine=quarantine,
        command_timeout=30.0,
        done={},
    )


def unpin(path: Path, key: NsKey, netns_dir: Path, live: frozenset[NsKey] = frozenset(), stale: bool = False) -> Done:
    pin = NetnsPin(
        name=path.name,
        path=str(path),
        directory=str(path.parent),
        ns=key,
        is_namespace=not stale,
        mtime=0.0,
        runtime_named=True,
    )
    return netns.reclaim([pin], context(netns_dir, live))[("netns", str(path))]


def lease(path: Path, ifname: str | None = "eth0") -> HostLocalLease:
    return HostLocalLease(
        network="net1",
        ip=path.name,
        container_id=CID,
        ifname=ifname,
        path=str(path),
        data_dir=str(path.parent.parent),
        mtime=0.0,
    )


@pytest.fixture
def pins(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "netns"
    directory.mkdir()
    yield directory
    for pin in directory.iterdir():
        if namespace_of(str(pin)) is not None and fs_type(str(pin)) == NSFS_MAGIC:
            umount(str(pin), 2)
        pin.unlink()


def make_pin(directory: Path, name: str = "cni-11111111-2222-3333-4444-555555555555") -> Path:
    path = directory / name
    path.touch()
    subprocess.run(["unshare", f"--net={path}", "true"], check=True)
    return path


def ns(path: Path) -> NsKey:
    key = namespace_of(str(path))
    assert key is not None
    return key


def test_a_pin_with_a_process_inside_is_kept(pins: Path) -> None:
    pin = make_pin(pins)
    sleeper = subprocess.Popen(["nsenter", f"--net={pin}", "sleep", "30"])
    try:
        for _ in range(100):  # until nsenter has exec'd sleep inside the namespace
            if namespace_of(f"/proc/{sleeper.pid}/ns/net") == ns(pin):
                break
            subprocess.run(["sleep", "0.02"], check=True)
        done = unpin(pin, ns(pin), pins)
        assert not done.ok and f"pid {sleeper.pid}" in str(done.error)
        assert pin.exists() and fs_type(str(pin)) == NSFS_MAGIC
    finally:
        sleeper.kill()
        sleeper.wait()
    assert unpin(pin, ns(pin), pins).ok and not pin.exists()


def test_a_pin_of_another_namespace_or_a_live_sandbox_or_outside_the_dirs_is_kept(pins: Path, tmp_path: Path) -> None:
    pin = make_pin(pins)
    other = NsKey(ns(pin).dev, ns(pin).ino + 1)
    assert "another namespace" in str(unpin(pin, other, pins).error) and pin.exists()
    assert "live sandbox" in str(unpin(pin, ns(pin), pins, frozenset({ns(pin)})).error) and pin.exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert "not directly inside" in str(unpin(pin, ns(pin), elsewhere).error) and pin.exists()
    # A symlink in the netns dir is never followed to what it points at.
    link = pins / "cni-99999999-2222-3333-4444-555555555555"
    link.symlink_to(pin)
    assert "symlink" in str(unpin(link, ns(pin), pins).error) and pin.exists() and link.is_symlink()
    link.unlink()


def test_a_stale_pin_is_removed_only_while_stale(pins: Path) -> None:
    stale = pins / "cni-00000000-0000-0000-0000-000000000000"
    stale.touch()
    assert unpin(stale, NsKey(0, 0), pins, stale=True).ok and not stale.exists()
    remounted = make_pin(pins, stale.name)  # a namespace was mounted there since
    done = unpin(remounted, NsKey(0, 0), pins, stale=True)
    assert "mounted on it now" in str(done.error) and remounted.exists()


def lease_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "ipam" / "net1"
    directory.mkdir(parents=True)
    (directory / "lock").touch()
    return directory


def test_a_lease_is_released_only_while_it_names_the_orphan(tmp_path: Path) -> None:
    directory = lease_dir(tmp_path)
    mine, theirs, legacy = directory / "10.0.0.2", directory / "10.0.0.3", directory / "10.0.0.4"
    mine.write_bytes(f"{CID}\r\neth0".encode())
    theirs.write_bytes(f"{'d' * 64}\r\neth0".encode())  # the IP was given to another pod since
    legacy.write_bytes(CID.encode())
    done = hostlocal.release_leases([lease(mine), lease(theirs), lease(legacy, None)], None)
    assert done[("ipam", str(mine))].ok and not mine.exists()
    refused = done[("ipam", str(theirs))]
    assert not refused.ok and "another container" in str(refused.error) and theirs.exists()
    assert done[("ipam", str(legacy))].ok and not legacy.exists()


def test_a_lease_is_not_touched_while_host_local_holds_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = lease_dir(tmp_path)
    path = directory / "10.0.0.2"
    path.write_bytes(f"{CID}\r\neth0".encode())
    key = ("ipam", str(path))
    with open(directory / "lock", "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as host-local holds it while allocating
        done = hostlocal.release_leases([lease(path)], None, lock_wait=0.3)
    assert not done[key].ok and "held" in str(done[key].error) and path.exists()
    done = hostlocal.release_leases([lease(path)], None)
    assert done[key].ok and not path.exists()


def test_a_symlinked_lease_is_never_deleted_through(tmp_path: Path) -> None:
    directory = lease_dir(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(f"{CID}\r\neth0".encode())
    link = directory / "10.0.0.9"
    link.symlink_to(victim)
    done = hostlocal.release_leases([lease(link)], None)
    assert not done[("ipam", str(link))].ok and victim.exists() and link.is_symlink()


def test_a_cache_file_is_removed_only_while_it_names_the_attachment(tmp_path: Path) -> None:
    entry = {"kind": "cniCacheV1", "containerId": CID, "networkName": "net1", "ifName": "eth0"}
    path = tmp_path / f"net1-{CID}-eth0"
    path.write_text(json.dumps({**entry, "containerId": "e" * 64}))  # another attachment's now
    record = CacheEntry(
        path=str(path),
        name=path.name,
        container_id=CID,
        network="net1",
        ifname="eth0",
        netns_path=None,
        netns=None,
        host_ifnames=(),
        legacy=False,
        mtime=0.0,
        cache_dir=str(tmp_path),
    )
    key = ("cache", str(path))
    done = cache.reclaim([record], context(tmp_path))
    assert not done[key].ok and "another attachment" in str(done[key].error) and path.exists()
    path.write_text(json.dumps(entry))
    qdir = tmp_path / "quarantine"
    done = cache.reclaim([record], context(tmp_path, quarantine=Quarantine(str(qdir))))
    moved = done[key].quarantined
    assert done[key].ok and not path.exists() and moved is not None
    assert json.loads(Path(moved).read_text()) == entry and moved.endswith(str(path))
    assert oct(os.stat(moved).st_mode & 0o777) == "0o600"


def test_quarantine_refuses_a_symlinked_path(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    quarantine = Quarantine(str(qdir))
    data = tmp_path / "data"
    source = data / "lease"
    source.parent.mkdir()
    source.write_text("x")
    # An attacker links a directory inside the quarantine to somewhere else.
    outside = tmp_path / "outside"
    outside.mkdir()
    target_parent = Path(quarantine.destination(str(source))).parent
    target_parent.parent.mkdir(parents=True)
    target_parent.symlink_to(outside)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        quarantine.move(str(data), str(source), source.stat())
    assert source.exists() and not any(outside.iterdir())


def test_a_chain_that_is_gone_already_counts_as_freed(tmp_path: Path) -> None:
    # In a scratch netns: its nat table has no such chain, so there is nothing to delete.
    scratch = tmp_path / "scratch"
    scratch.touch()
    subprocess.run(["unshare", f"--net={scratch}", "true"], check=True)
    try:
        chain = f"CNI-{secrets.token_hex(12)}"
        out = subprocess.run(
            ["nsenter", f"--net={scratch}", *probe_argv(gone_chain, chain)], capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout) == {chain: True}
    finally:
        umount(str(scratch), 2)
        scratch.unlink()


def test_a_pin_is_a_namespace_by_its_device_or_its_filesystem_and_a_plain_file_is_stale(pins: Path) -> None:
    """The look tells a pinned namespace by the device every namespace's inode is on, else by
    its filesystem's magic (no /proc to learn the device from): the same answer either way."""
    pinned, plain = make_pin(pins), pins / "cni-00000000-0000-0000-0000-000000000000"
    plain.touch()
    nsfs = os.stat("/proc/self/ns/net").st_dev
    dir_fd = os.open(pins, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for device in (nsfs, None):
            st, is_ns = pins_module.look_at(dir_fd, pinned.name, device)
            assert is_ns and NsKey(st.st_dev, st.st_ino) == ns(pinned) and st.st_dev == nsfs
            assert pins_module.look_at(dir_fd, plain.name, device)[1] is False
    finally:
        os.close(dir_fd)
    found = {p.name: p.is_namespace for p in netns.collect_pins((str(pins),), ())[0]}
    assert found == {pinned.name: True, plain.name: False}
