"""The compare-before-delete rules of direct kernel cleanup, on real files, pins and processes."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.inventory.fsutil import NSFS_MAGIC, fs_type, namespace_of
from reaper.model import NsKey
from reaper.reclaim import kernel
from reaper.reclaim.quarantine import Quarantine, QuarantineError
from tests.lab.kernel import umount

CID = "c" * 64


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
        done = kernel.unpin_all([kernel.PinTarget(str(pin), ns(pin), False)], (str(pins),), set(), ())
        assert not done[str(pin)].ok and f"pid {sleeper.pid}" in str(done[str(pin)].error)
        assert pin.exists() and fs_type(str(pin)) == NSFS_MAGIC
    finally:
        sleeper.kill()
        sleeper.wait()
    done = kernel.unpin_all([kernel.PinTarget(str(pin), ns(pin), False)], (str(pins),), set(), ())
    assert done[str(pin)].ok and not pin.exists()


def test_a_pin_of_another_namespace_or_a_live_sandbox_or_outside_the_dirs_is_kept(pins: Path, tmp_path: Path) -> None:
    pin = make_pin(pins)
    other = NsKey(ns(pin).dev, ns(pin).ino + 1)
    done = kernel.unpin_all([kernel.PinTarget(str(pin), other, False)], (str(pins),), set(), ())
    assert "another namespace" in str(done[str(pin)].error) and pin.exists()
    done = kernel.unpin_all([kernel.PinTarget(str(pin), ns(pin), False)], (str(pins),), {ns(pin)}, ())
    assert "live sandbox" in str(done[str(pin)].error) and pin.exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = kernel.unpin_all([kernel.PinTarget(str(pin), ns(pin), False)], (str(elsewhere),), set(), ())
    assert "not directly inside" in str(done[str(pin)].error) and pin.exists()
    # A symlink in the netns dir is never followed to what it points at.
    link = pins / "cni-99999999-2222-3333-4444-555555555555"
    link.symlink_to(pin)
    done = kernel.unpin_all([kernel.PinTarget(str(link), ns(pin), False)], (str(pins),), set(), ())
    assert "symlink" in str(done[str(link)].error) and pin.exists() and link.is_symlink()
    link.unlink()


def test_a_stale_pin_is_removed_only_while_stale(pins: Path) -> None:
    stale = pins / "cni-00000000-0000-0000-0000-000000000000"
    stale.touch()
    done = kernel.unpin_all([kernel.PinTarget(str(stale), NsKey(0, 0), True)], (str(pins),), set(), ())
    assert done[str(stale)].ok and not stale.exists()
    remounted = make_pin(pins, stale.name)  # a namespace was mounted there since
    done = kernel.unpin_all([kernel.PinTarget(str(remounted), NsKey(0, 0), True)], (str(pins),), set(), ())
    assert "mounted on it now" in str(done[str(remounted)].error) and remounted.exists()


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
    targets = [kernel.LeaseTarget(str(p), CID, "eth0") for p in (mine, theirs)]
    targets.append(kernel.LeaseTarget(str(legacy), CID, None))
    done = kernel.release_leases(targets, None)
    assert done[str(mine)].ok and not mine.exists()
    assert not done[str(theirs)].ok and "another container" in str(done[str(theirs)].error) and theirs.exists()
    assert done[str(legacy)].ok and not legacy.exists()


def test_a_lease_is_not_touched_while_host_local_holds_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = lease_dir(tmp_path)
    lease = directory / "10.0.0.2"
    lease.write_bytes(f"{CID}\r\neth0".encode())
    with open(directory / "lock", "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as host-local holds it while allocating
        done = kernel.release_leases([kernel.LeaseTarget(str(lease), CID, "eth0")], None, lock_wait=0.3)
    assert not done[str(lease)].ok and "held" in str(done[str(lease)].error) and lease.exists()
    done = kernel.release_leases([kernel.LeaseTarget(str(lease), CID, "eth0")], None)
    assert done[str(lease)].ok and not lease.exists()


def test_a_symlinked_lease_is_never_deleted_through(tmp_path: Path) -> None:
    directory = lease_dir(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(f"{CID}\r\neth0".encode())
    link = directory / "10.0.0.9"
    link.symlink_to(victim)
    done = kernel.release_leases([kernel.LeaseTarget(str(link), CID, "eth0")], None)
    assert not done[str(link)].ok and victim.exists() and link.is_symlink()


def test_a_cache_file_is_removed_only_while_it_names_the_attachment(tmp_path: Path) -> None:
    entry = {"kind": "cniCacheV1", "containerId": CID, "networkName": "net1", "ifName": "eth0"}
    path = tmp_path / f"net1-{CID}-eth0"
    path.write_text(json.dumps({**entry, "containerId": "e" * 64}))

    def still_names(data: bytes, target: kernel.CacheTarget) -> bool:
        doc = json.loads(data)
        return bool(doc["containerId"] == target.container_id)

    target = kernel.CacheTarget(str(path), CID, "net1", "eth0", False)
    done = kernel.remove_cache_files([target], None, still_names)
    assert not done[str(path)].ok and path.exists()
    path.write_text(json.dumps(entry))
    qdir = tmp_path / "quarantine"
    done = kernel.remove_cache_files([target], Quarantine(str(qdir)), still_names)
    moved = done[str(path)].quarantined
    assert done[str(path)].ok and not path.exists() and moved is not None
    assert json.loads(Path(moved).read_text()) == entry and moved.endswith(str(path))
    assert oct(os.stat(moved).st_mode & 0o777) == "0o600"


def test_quarantine_refuses_a_symlinked_path(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    quarantine = Quarantine(str(qdir))
    source = tmp_path / "data" / "lease"
    source.parent.mkdir()
    source.write_text("x")
    # An attacker links a directory inside the quarantine to somewhere else.
    outside = tmp_path / "outside"
    outside.mkdir()
    target_parent = Path(quarantine.base + str(source.parent))
    target_parent.parent.mkdir(parents=True)
    target_parent.symlink_to(outside)
    with pytest.raises(QuarantineError, match="symlink"):
        quarantine.move(str(source))
    assert source.exists() and not any(outside.iterdir())


def test_a_chain_that_is_gone_already_counts_as_freed(tmp_path: Path) -> None:
    # In a scratch netns: its nat table has no such chain, so there is nothing to delete.
    scratch = tmp_path / "scratch"
    scratch.touch()
    subprocess.run(["unshare", f"--net={scratch}", "true"], check=True)
    try:
        chain = f"CNI-{secrets.token_hex(12)}"
        probe = (
            "from reaper.reclaim import kernel; import json; "
            f"d = kernel.remove_chains([kernel.ChainTarget('ipv4', 'nat', '{chain}', 'nft')], 10); "
            "print(json.dumps({k[2]: v.ok for k, v in d.items()}))"
        )
        out = subprocess.run(
            ["nsenter", f"--net={scratch}", sys.executable, "-c", probe],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert json.loads(out.stdout) == {chain: True}
    finally:
        umount(str(scratch), 2)
        scratch.unlink()
