"""Confinement beneath a root: what a writer of the root can make the reaper read or delete."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.host.confined import (
    NO_SYMLINKS,
    Changed,
    Escapes,
    RootRefused,
    UnfitFile,
    open_beneath,
    open_root,
    openat2,
    opened_dir,
    read_beneath,
    read_fd,
    same_file,
    unlink_beneath,
)
from reaper.host.quarantine import MAX_QUARANTINE_BYTES, Quarantine, remove_or_quarantine
from tests.harness.fifo import raised_unless_it_waits


@pytest.fixture(params=["openat2", "walk"])
def walk_only(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "walk")


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A root with results/ inside, and a victim dir outside it."""
    root = tmp_path / "root"
    (root / "results").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "net-a-eth0").write_text("host secret")
    yield root, victim


def test_a_file_is_read_whole_whether_or_not_its_size_says_so(tmp_path: Path) -> None:
    # Its size as fstat gives it: one read. /proc's files say 0 bytes and hold more: read on
    # until EOF, every chunk kept, and still refused past the limit.
    data = os.urandom(300_000)
    (tmp_path / "memo").write_bytes(data)
    assert read_beneath(str(tmp_path), str(tmp_path / "memo"), len(data))[0] == data
    fd = os.open("/proc/self/maps", os.O_RDONLY)
    try:
        got, st = read_fd(fd, 1 << 20)
    finally:
        os.close(fd)
    assert st.st_size == 0 and len(got) > 1 and got.endswith(b"\n") and b"[stack]" in got
    fd = os.open("/proc/self/maps", os.O_RDONLY)
    try:
        with pytest.raises(UnfitFile):
            read_fd(fd, 10)
    finally:
        os.close(fd)


def test_a_symlinked_directory_on_the_way_is_never_followed(tree: tuple[Path, Path], walk_only: bool) -> None:
    root, victim = tree
    (root / "results").rmdir()
    (root / "results").symlink_to(victim)
    with _root(root) as fd, pytest.raises(OSError) as err:
        open_beneath(fd, ("results", "net-a-eth0"), os.O_RDONLY, walk_only=walk_only)
    assert err.value.errno == errno.ELOOP
    with pytest.raises(OSError) as err:
        read_beneath(str(root), str(root / "results" / "net-a-eth0"), 1024)
    assert err.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        unlink_beneath(str(root), str(root / "results" / "net-a-eth0"), lambda st: None)
    assert (victim / "net-a-eth0").read_text() == "host secret"


class _root:
    def __init__(self, path: Path) -> None:
        self.fd = open_root(str(path))

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def test_a_symlinked_file_is_not_read_or_unlinked_through(tree: tuple[Path, Path]) -> None:
    root, victim = tree
    link = root / "results" / "net-a-eth0"
    link.symlink_to(victim / "net-a-eth0")
    with pytest.raises(OSError) as err:
        read_beneath(str(root), str(link), 1024)
    assert err.value.errno == errno.ELOOP
    # An unlink removes the link itself at most, never what it points at.
    unlink_beneath(str(root), str(link), lambda st: None)
    assert not link.is_symlink() and (victim / "net-a-eth0").read_text() == "host secret"


def test_a_root_that_is_a_symlink_is_refused(tree: tuple[Path, Path]) -> None:
    root, victim = tree
    linked = root.parent / "linked-root"
    linked.symlink_to(victim)
    with pytest.raises(RootRefused, match="is a symlink"):
        open_root(str(linked))
    with pytest.raises(RootRefused, match="is a symlink"):
        read_beneath(str(linked), str(linked / "net-a-eth0"), 1024)
    plain = root.parent / "file"
    plain.write_text("")
    with pytest.raises(RootRefused, match="not a directory"):
        open_root(str(plain))


@pytest.mark.parametrize("path", ["/etc/passwd", "{root}/../victim/net-a-eth0", "{root}/results/../../x", "{root}x/y"])
def test_paths_outside_their_root_are_refused(tree: tuple[Path, Path], path: str) -> None:
    root, _ = tree
    with pytest.raises(Escapes):
        read_beneath(str(root), path.format(root=root), 1024)
    with pytest.raises(Escapes):
        unlink_beneath(str(root), path.format(root=root), lambda st: None)


def test_dotdot_never_leaves_the_root(tree: tuple[Path, Path], walk_only: bool) -> None:
    root, _ = tree
    with _root(root) as fd, pytest.raises(Escapes):
        open_beneath(fd, ("..", "victim", "net-a-eth0"), os.O_RDONLY, walk_only=walk_only)


def test_a_fifo_is_neither_read_nor_waited_on(tree: tuple[Path, Path]) -> None:
    """Opened without waiting (O_NONBLOCK), and refused by its type before any read."""
    root, _ = tree
    fifo = root / "results" / "net-a-eth0"
    os.mkfifo(fifo)
    raised = raised_unless_it_waits(fifo, lambda: read_beneath(str(root), str(fifo), 1024))
    assert isinstance(raised, UnfitFile) and "not a regular file" in str(raised), raised


def test_unlink_compares_the_inode_first(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    path = root / "results" / "f"
    path.write_text("judged")
    judged = path.stat()
    path.unlink()
    path.write_text("another file, same name")  # a new inode
    os.utime(path, ns=(judged.st_atime_ns, judged.st_mtime_ns))
    with pytest.raises(Changed, match="replaced"):
        unlink_beneath(str(root), str(path), same_file(judged))
    assert path.read_text() == "another file, same name"
    unlink_beneath(str(root), str(path), same_file(path.stat()))
    assert not path.exists()


def test_opened_dir_with_create_refuses_a_planted_link(tree: tuple[Path, Path]) -> None:
    root, victim = tree
    (root / "a").symlink_to(victim)
    with pytest.raises(OSError) as err, opened_dir(str(root), str(root / "a" / "b"), create=True):
        pass
    assert err.value.errno == errno.ELOOP and not (victim / "b").exists()


# ------------------------------------------------------------------------------ quarantine


def test_quarantine_moves_only_the_judged_regular_file(tree: tuple[Path, Path]) -> None:
    root, victim = tree
    lease = root / "results" / "10.0.0.9"
    lease.write_text("c1\r\neth0")
    judged = lease.stat()
    quarantine = Quarantine(str(root.parent / "q"))
    # Swapped for a link to a secret after it was judged: nothing moves, nothing is copied.
    lease.unlink()
    lease.symlink_to(victim / "net-a-eth0")
    done = remove_or_quarantine(str(root), str(lease), judged, quarantine)
    assert not done.ok and lease.is_symlink()
    assert not Path(quarantine.destination(str(lease))).exists()
    lease.unlink()
    lease.write_text("c1\r\neth0")
    done = remove_or_quarantine(str(root), str(lease), lease.stat(), quarantine)
    assert done.ok and done.quarantined == quarantine.destination(str(lease)) and not lease.exists()
    assert Path(done.quarantined).read_bytes() == b"c1\r\neth0"


def test_quarantine_across_filesystems_copies_from_the_checked_fd(tree: tuple[Path, Path]) -> None:
    if os.stat("/dev/shm").st_dev == os.stat(tree[0]).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp dir")
    root, _ = tree
    qdir = Path(f"/dev/shm/reaper-q-{os.getpid()}-{threading.get_ident()}")
    try:
        entry = root / "results" / "net-b-eth0"
        entry.write_bytes(b'{"kind":"cniCacheV1"}')
        done = remove_or_quarantine(str(root), str(entry), entry.stat(), Quarantine(str(qdir)))
        assert done.ok and done.quarantined is not None and not entry.exists()
        copied = Path(done.quarantined)
        assert copied.read_bytes() == b'{"kind":"cniCacheV1"}' and oct(copied.stat().st_mode & 0o777) == "0o600"
        # A file that grew past the bound is not copied and stays.
        big = root / "results" / "net-c-eth0"
        with big.open("wb") as f:
            f.truncate(MAX_QUARANTINE_BYTES + 1)
        done = remove_or_quarantine(str(root), str(big), big.stat(), Quarantine(str(qdir)))
        assert not done.ok and "over" in str(done.error) and big.exists()
        assert not Path(Quarantine(str(qdir)).destination(str(big))).exists()
    finally:
        for dirpath, dirnames, filenames in os.walk(qdir, topdown=False):
            for name in filenames:
                os.unlink(os.path.join(dirpath, name))
            for name in dirnames:
                os.rmdir(os.path.join(dirpath, name))
        if qdir.exists():
            qdir.rmdir()


def test_openat2_is_what_runs_here_and_refuses_links_itself(tree: tuple[Path, Path]) -> None:
    """The openat2 branch is exercised, not only the walk: this kernel (5.6+) has it."""
    root, victim = tree
    (root / "results" / "f").write_text("x")
    (root / "results" / "link").symlink_to(victim / "net-a-eth0")
    with _root(root) as fd:
        opened = openat2(fd, "results/f", os.O_RDONLY, 0, NO_SYMLINKS)
        assert opened is not None, "openat2 unavailable: only the walk was tested"
        os.close(opened)
        with pytest.raises(OSError) as err:
            openat2(fd, "results/link", os.O_RDONLY, 0, NO_SYMLINKS)
        assert err.value.errno == errno.ELOOP
        with pytest.raises(Escapes):
            openat2(fd, "../victim/net-a-eth0", os.O_RDONLY, 0, NO_SYMLINKS)
