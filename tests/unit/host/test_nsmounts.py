"""The mount walk on fake /proc trees: mountinfo parsed as the kernel escapes it, every mount
namespace read once, bounded, and never a partial answer that would let a held namespace go."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from reaper.host import nsmounts
from reaper.host.mounts import parse_line
from reaper.host.nsmounts import (
    HeldMounts,
    NsMount,
    held_mounts,
    in_use,
    mount_held,
    parse_mountinfo,
)
from reaper.host.procs import EveryNamespaceBusy
from reaper.model import NsKey

NSFS = os.makedev(0, 4)
ROOT = "1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw"
RUN = "20 1 0:25 / /run rw shared:2 - tmpfs tmpfs rw"
NETNS_DIR = "21 20 0:25 /netns /run/netns rw shared:3 - tmpfs tmpfs rw"


def nsfs(mount_id: int, parent: int, ino: int, point: str, kind: str = "net", fstype: str = "nsfs") -> str:
    return f"{mount_id} {parent} 0:4 {kind}:[{ino}] {point} rw shared:{mount_id} - {fstype} nsfs rw"


def test_a_mountinfo_line_is_read_with_its_escapes_and_optional_fields() -> None:
    line = parse_line("36 35 98:0 /mnt1 /mnt\\0402\\134x rw,noatime master:1 shared:7 - ext3 /dev/root rw\n")
    assert line is not None
    assert (line.mount_id, line.parent_id, line.dev) == (36, 35, os.makedev(98, 0))
    assert (line.root, line.point, line.fstype) == ("/mnt1", "/mnt 2\\x", "ext3")
    assert line.tags == ("master:1", "shared:7")
    for broken in ("", "36 35 98:0 / /x rw", "x 35 98:0 / /x rw - ext3 a b", "36 35 98 / /x rw - ext3 a b"):
        assert parse_line(broken) is None


def test_only_mounts_of_network_namespaces_are_kept_and_other_nsfs_mounts_are_not() -> None:
    info = parse_mountinfo(
        [
            ROOT,
            RUN,
            NETNS_DIR,
            nsfs(30, 21, 4026532001, "/run/netns/cni-a"),
            nsfs(31, 20, 4026532002, "/run/ipc-pin", kind="ipc"),
            nsfs(32, 20, 4026532003, "/run/cg", kind="cgroup"),
            nsfs(33, 20, 4026532004, "/run/a\\040held\\012pin"),  # escaped space and newline
            nsfs(34, 20, 4026532005, "/run/old", fstype="proc"),  # namespace files before nsfs
            "35 20 0:25 /net:[4026532006] /run/fake rw - tmpfs tmpfs rw",  # a file named so: no namespace
            "36 20 0:26 net:[4026532007] /run/fake2 rw - tmpfs tmpfs rw",  # not nsfs
            nsfs(37, 20, 4026532008, "/run/mnt-pin", kind="mnt"),
            "garbage",
        ]
    )
    net = {(line.root, line.point): on for line, on, _ in info.net}
    assert net == {
        ("net:[4026532001]", "/run/netns/cni-a"): (os.makedev(0, 25), "/netns/cni-a"),
        ("net:[4026532004]", "/run/a held\npin"): (os.makedev(0, 25), "/a held\npin"),
        ("net:[4026532005]", "/run/old"): (os.makedev(0, 25), "/old"),
    }
    assert info.pinned_mount_namespaces == ((4026532008, "/run/mnt-pin", True),)


def test_a_huge_mountinfo_is_refused_not_half_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nsmounts, "MAX_LINES", 10)
    with pytest.raises(OSError) as raised:
        parse_mountinfo([ROOT] * 11)
    assert raised.value.errno == errno.EFBIG
    with pytest.raises(OSError):
        parse_mountinfo([ROOT + " " + "x" * nsmounts.MAX_LINE])


class FakeProc:
    """A /proc of fake processes: each a dir with ns/mnt (processes of one mount namespace
    share its inode, by hard link) and a mountinfo."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.namespaces: dict[str, Path] = {}

    def process(self, pid: int, mount_ns: str, lines: list[str] | None, tid: int | None = None) -> None:
        """Process `pid`, or its thread `tid` (a process with two shows its threads)."""
        base = self.root / str(pid) if tid is None else self.root / str(pid) / "task" / str(tid)
        (base / "ns").mkdir(parents=True)
        if mount_ns not in self.namespaces:
            self.namespaces[mount_ns] = self.root / f".mnt-{mount_ns}"
            self.namespaces[mount_ns].touch()
        os.link(self.namespaces[mount_ns], base / "ns" / "mnt")
        if lines is not None:
            (base / "mountinfo").write_text("".join(line + "\n" for line in lines))

    def ino(self, mount_ns: str) -> int:
        return self.namespaces[mount_ns].stat().st_ino


def every_mount(proc: str, parsed: nsmounts.ParsedMountinfo | None = None) -> list[NsMount]:
    """Each mount of a network namespace a walk finds: with no netns dir, none is a pin."""
    return mounts_in(held_mounts((), proc, parsed))


def mounts_in(walk: HeldMounts) -> list[NsMount]:
    return [m for found in walk.held.values() for m in found]


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc")
    fake.root.mkdir()
    fake.process(os.getpid(), "host", [ROOT, RUN, NETNS_DIR, nsfs(30, 21, 4026532001, "/run/netns/cni-a")])
    return fake


def test_each_mount_namespace_is_read_once_through_any_of_its_processes(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")]
    proc.process(100, "other", None)  # exited while walked: no mountinfo any more
    proc.process(101, "other", held)
    proc.process(102, "other", held)
    proc.process(2**22 + 3, "host", [ROOT])  # the host's, already read through this process
    read: list[str] = []
    real = nsmounts._read_open

    def counting(path: str) -> tuple[bytes, int]:
        read.append(path)
        return real(path)

    monkeypatch.setattr(nsmounts, "_read_open", counting)
    found = every_mount(str(proc.root))
    assert sorted(Path(p).parent.name for p in read) == sorted(["100", "101", str(os.getpid())])
    assert sorted((m.pid, m.mount_point, m.ns) for m in found) == sorted(
        [(os.getpid(), "/run/netns/cni-a", NsKey(NSFS, 4026532001)), (101, "/run/held", NsKey(NSFS, 4026532009))]
    )
    assert {m.mount_ns for m in found} == {proc.ino("host"), proc.ino("other")}


def test_a_mountinfo_that_vanishes_mid_walk_is_read_through_another_process(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")])
    proc.process(101, "other", [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")])
    real = nsmounts._read_open

    def vanishing(path: str) -> tuple[bytes, int]:
        if "/100/" in path:
            raise FileNotFoundError(errno.ENOENT, "gone", path)  # the process exited mid-read
        return real(path)

    monkeypatch.setattr(nsmounts, "_read_open", vanishing)
    assert [m.pid for m in every_mount(str(proc.root)) if m.mount_point == "/run/held"] == [101]


def test_a_mountinfo_of_a_task_past_exit_is_einval_and_read_through_another_process(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task of a mount namespace of its own that exits between the look at its ns/mnt and the
    open of its mountinfo (a pod's pause killed mid-walk): the kernel says EINVAL, not ENOENT.
    Its ns/mnt gone too, it exited; with its ns/mnt still there, the walk is not whole."""
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")])
    proc.process(101, "other", [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")])
    real = nsmounts._read_open
    exiting = {"100"}  # tasks that exit as their mountinfo is opened

    def einval(path: str) -> tuple[bytes, int]:
        task = Path(path).parent
        if task.name not in ("101", str(os.getpid())):
            if task.name in exiting:
                (task / "ns" / "mnt").unlink()
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real(path)

    monkeypatch.setattr(nsmounts, "_read_open", einval)
    assert [m.pid for m in every_mount(str(proc.root)) if m.mount_point == "/run/held"] == [101]
    proc.process(103, "another", [ROOT, RUN])
    with pytest.raises(OSError, match="Invalid argument"):
        every_mount(str(proc.root))


def test_a_walk_that_cannot_be_whole_raises_instead_of_finding_no_mount(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")])
    real = nsmounts._read_open

    def failing(path: str) -> tuple[bytes, int]:
        if "/100/" in path:
            raise OSError(errno.EIO, "I/O error", path)  # not an exit: that namespace is unseen
        return real(path)

    monkeypatch.setattr(nsmounts, "_read_open", failing)
    with pytest.raises(OSError):
        every_mount(str(proc.root))
    busy = mount_held((), str(proc.root))
    assert isinstance(busy, EveryNamespaceBusy) and NsKey(NSFS, 4026532009) in busy


class Entering:
    """Fakes of the ways into a mount namespace no process is in: `open_pin` opens /dev/null
    (recording the way), `entered` yields a fake helper's /proc dir (ns/mnt a hard link to the
    namespace's file, its mountinfo the lines given), or fails as told."""

    def __init__(self, proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.proc, self.tmp = proc, tmp_path
        self.opened: list[tuple[str, str, int]] = []
        self.entered: list[int] = []
        self.mountinfo: dict[int, list[str]] = {}
        self.fails: OSError | None = None
        self.unreachable: set[int] = set()
        self.root_made = True
        monkeypatch.setattr(nsmounts, "open_pin", self.open_pin)
        monkeypatch.setattr(nsmounts, "entered", self.enter)
        monkeypatch.setattr(nsmounts, "made_by_user", lambda fd: None if self.root_made else 65534)
        monkeypatch.setattr(nsmounts, "_users_at", lambda base, ns: not self.root_made)

    def namespace(self, name: str, lines: list[str]) -> int:
        self.proc.namespaces[name] = self.tmp / f".mnt-{name}"
        self.proc.namespaces[name].touch()
        ino = self.proc.ino(name)
        helper = self.tmp / f"helper-{ino}"
        (helper / "ns").mkdir(parents=True)
        os.link(self.proc.namespaces[name], helper / "ns" / "mnt")
        (helper / "mountinfo").write_text("".join(line + "\n" for line in lines))
        return ino

    def open_pin(self, root: str, point: str, ino: int) -> int:
        self.opened.append((root, point, ino))
        if ino in self.unreachable:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")  # a tmpfs over its dir, say
        return os.open(os.devnull, os.O_RDONLY)

    @contextlib.contextmanager
    def enter(self, fd: int, ino: int) -> Iterator[str]:
        self.entered.append(ino)
        if self.fails is not None:
            raise self.fails
        yield str(self.tmp / f"helper-{ino}")


@pytest.fixture
def entering(proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Entering:
    return Entering(proc, tmp_path, monkeypatch)


def test_a_mount_namespace_pinned_with_no_process_in_it_is_read_through_a_child_in_it(
    proc: FakeProc, entering: Entering, tmp_path: Path
) -> None:
    inner = entering.namespace("inner", [ROOT, RUN, nsfs(43, 20, 4026532011, "/run/held-deeper")])
    pinned = entering.namespace(
        "pinned", [ROOT, RUN, nsfs(41, 20, 4026532010, "/run/held-there"), nsfs(42, 20, inner, "/run/deeper", "mnt")]
    )
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, pinned, "/run/mnt-pin", kind="mnt")])
    found = {m.mount_point: m for m in every_mount(str(proc.root)) if m.pid == nsmounts.NO_PROCESS}
    # Reached beneath the pinning process's root, then the one pinned inside it beneath the
    # child's, while that child is there: both read.
    assert entering.opened == [
        (f"{proc.root}/100/root", "/run/mnt-pin", pinned),
        (f"{tmp_path}/helper-{pinned}/root", "/run/deeper", inner),
    ]
    assert entering.entered == [pinned, inner]
    assert {point: (m.mount_ns, m.ns) for point, m in found.items()} == {
        "/run/held-there": (pinned, NsKey(NSFS, 4026532010)),
        "/run/held-deeper": (inner, NsKey(NSFS, 4026532011)),
    }
    assert "no process in it" in found["/run/held-there"].describe()
    assert {m.made_by_user for m in found.values()} == {None}  # root's: nothing to tell later


def test_a_users_pinned_mount_namespace_names_its_maker_on_each_mount(proc: FakeProc, entering: Entering) -> None:
    """No pid can be asked later who made a mount namespace no process is in: the walk tells
    it on each mount read there, so the address check weighs those mounts as the user's."""
    entering.root_made = False
    pinned = entering.namespace("pinned", [ROOT, RUN, nsfs(41, 20, 4026532010, "/run/held-there")])
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, pinned, "/run/mnt-pin", kind="mnt")])
    found = [m for m in every_mount(str(proc.root)) if m.pid == nsmounts.NO_PROCESS]
    assert [(m.mount_point, m.made_by_user) for m in found] == [("/run/held-there", 65534)]


def test_a_root_made_pinned_namespace_that_cannot_be_entered_or_reached_fails_the_walk(
    proc: FakeProc, entering: Entering
) -> None:
    pinned = entering.namespace("pinned", [ROOT, RUN])
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, pinned, "/run/mnt-pin", kind="mnt")])
    entering.fails = OSError(errno.EPERM, "mount namespace mnt:[x] cannot be entered")
    with pytest.raises(OSError, match="cannot be entered"):
        every_mount(str(proc.root))
    assert isinstance(mount_held((), str(proc.root)), EveryNamespaceBusy)
    entering.fails = None
    entering.unreachable.add(pinned)
    with pytest.raises(OSError, match="cannot be reached: /run/mnt-pin: No such file"):
        every_mount(str(proc.root))
    assert isinstance(mount_held((), str(proc.root)), EveryNamespaceBusy)


def test_an_unprivileged_users_unreadable_mount_namespaces_are_left_out_not_every_namespace_busy(
    proc: FakeProc, entering: Entering, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a user made (an owner uid other than 0 up its user namespaces) and the reaper
    cannot read is left out and named; what can be read of it still holds."""
    entering.root_made = False
    unenterable = entering.namespace("unenterable", [ROOT])
    shadowed = entering.namespace("shadowed", [ROOT])
    fuse = "50 20 0:60 / /run/fuse rw - fuse fuse rw"
    proc.process(
        100,
        "users",
        [
            ROOT,
            RUN,
            fuse,
            nsfs(40, 20, 4026532010, "/run/held-by-user"),
            nsfs(41, 20, unenterable, "/run/a", kind="mnt"),
            nsfs(42, 20, shadowed, "/run/b", kind="mnt"),
            nsfs(43, 50, 4026539990, "/run/fuse/c", kind="mnt"),
        ],
    )
    proc.process(101, "huge", [ROOT] * 11)
    monkeypatch.setattr(nsmounts, "MAX_LINES", 10)
    entering.unreachable.add(shadowed)
    real = entering.enter

    @contextlib.contextmanager
    def enter(fd: int, ino: int) -> Iterator[str]:
        if ino == unenterable:
            raise OSError(errno.ETIMEDOUT, "joining timed out")
        with real(fd, ino) as base:
            yield base

    monkeypatch.setattr(nsmounts, "entered", enter)
    walk = held_mounts((), str(proc.root))
    assert [m.mount_point for m in mounts_in(walk) if m.pid == 100] == ["/run/held-by-user"]
    unread = "\n".join(walk.unread)
    assert len(walk.unread) == 4, unread
    for why in (f"mnt:[{unenterable}]", f"mnt:[{shadowed}]", "mnt:[4026539990]", "pid 101"):
        assert why in unread
    held = mount_held((), str(proc.root))
    assert not isinstance(held, EveryNamespaceBusy) and NsKey(NSFS, 4026532010) in held


def test_thousands_of_a_users_mount_namespaces_are_read_up_to_their_own_bound(
    proc: FakeProc, entering: Entering, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user can make mount namespaces by the thousand: past their own bound they are left out
    (counted, the first few named), never taking the bound of root's, which still fails the walk."""
    monkeypatch.setattr(nsmounts, "MAX_USER_MOUNT_NAMESPACES", 3)
    monkeypatch.setattr(nsmounts, "MAX_NOTES", 2)
    monkeypatch.setattr(nsmounts, "MAX_MOUNT_NAMESPACES", 3)
    users = {pid for pid in range(100, 110)}
    for pid in sorted(users):
        proc.process(pid, f"user{pid}", [ROOT, RUN, nsfs(40, 20, 4026532000 + pid, f"/run/held{pid}")])
    proc.process(200, "root1", [ROOT])
    monkeypatch.setattr(nsmounts, "_users_at", lambda base, ns: int(base.rsplit("/", 1)[1]) in users)
    walk = held_mounts((), str(proc.root))
    assert sorted(m.pid for m in mounts_in(walk) if m.mount_point.startswith("/run/held")) == [100, 101, 102]
    assert len(walk.unread) == 3 and walk.unread[-1] == "and 5 more", walk.unread
    assert "pid 103" in walk.unread[0]
    proc.process(201, "root2", [ROOT])
    proc.process(202, "root3", [ROOT])
    with pytest.raises(OSError, match="more than 3 mount namespaces"):
        held_mounts((), str(proc.root))


def test_a_pin_is_opened_beneath_the_processs_root_with_no_symlink_and_checked(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "run" / "pin").touch()
    (root / "link").symlink_to(root / "run")
    with pytest.raises(OSError) as raised:
        nsmounts.open_pin(str(root), "/run/pin", (root / "run" / "pin").stat().st_ino)
    assert raised.value.errno == errno.ESTALE  # a plain file, not nsfs: refused
    with pytest.raises(OSError) as raised:
        nsmounts.open_pin(str(root), "/link/pin", 1)
    assert raised.value.errno == errno.ELOOP


def test_only_namespaces_whose_user_namespaces_uid_0_made_are_root_made() -> None:
    fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    try:
        assert nsmounts.made_by_user(fd) is None  # the host's (or this test's root-made ones)
    finally:
        os.close(fd)
    plain = os.open(os.devnull, os.O_RDONLY)
    try:
        assert nsmounts.made_by_user(plain) is None  # what cannot be told is root's: fail closed
    finally:
        os.close(plain)


def test_too_many_mount_namespaces_or_a_proc_without_this_process_raise(
    proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for pid in range(100, 104):
        proc.process(pid, f"ns{pid}", [ROOT])
    monkeypatch.setattr(nsmounts, "MAX_MOUNT_NAMESPACES", 3)
    with pytest.raises(OSError, match="more than 3 mount namespaces"):
        every_mount(str(proc.root))
    other = tmp_path / "other-proc"
    (other / "1").mkdir(parents=True)
    with pytest.raises(OSError, match="does not list this process"):
        every_mount(str(other))


def held_elsewhere(
    mounts: Iterable[NsMount], netns_dirs: Iterable[str], own_mount_ns: int
) -> dict[NsKey, tuple[NsMount, ...]]:
    """An oracle of HeldMounts.held, judged record by record: the namespaces mounts hold, but
    pins (in `own_mount_ns`, directly in a netns dir) and their copies on the same file."""
    dirs = {os.path.realpath(d) for d in netns_dirs}
    mounts = list(mounts)
    pins = {(m.on, m.ns) for m in mounts if m.mount_ns == own_mount_ns and os.path.dirname(m.mount_point) in dirs}
    held: dict[NsKey, list[NsMount]] = {}
    for m in mounts:
        if m.on is None or (m.on, m.ns) not in pins:
            held.setdefault(m.ns, []).append(m)
    return {ns: tuple(sorted(found, key=reachable_first)) for ns, found in held.items()}


def reachable_first(mount: NsMount) -> tuple[bool, bool, int]:
    return (mount.pid == nsmounts.NO_PROCESS, mount.mount_ns == nsmounts.UNKNOWN_NS, mount.pid)


def pin_files_shared(mounts: Iterable[NsMount], netns_dirs: Iterable[str], own_mount_ns: int) -> dict[NsKey, str]:
    """An oracle of HeldMounts.shared, judged record by record: the pins whose file carries a
    mount of another namespace in another mount namespace."""
    dirs = {os.path.realpath(d) for d in netns_dirs}
    mounts = list(mounts)
    pins = {m.on: m.ns for m in mounts if m.mount_ns == own_mount_ns and os.path.dirname(m.mount_point) in dirs}
    shared: dict[NsKey, str] = {}
    for m in mounts:
        pin_ns = pins.get(m.on) if m.on is not None else None
        if pin_ns is not None and pin_ns != m.ns:
            shared.setdefault(pin_ns, f"its pin's file carries another namespace's mount: {m.describe()}")
    return shared


def test_pins_and_their_copies_on_the_same_file_are_no_holders(proc: FakeProc, tmp_path: Path) -> None:
    netns_dir = tmp_path / "netns"
    pin_dir = f"21 20 0:25 /netns {netns_dir} rw shared:3 - tmpfs tmpfs rw"
    own = [
        ROOT,
        RUN,
        pin_dir,
        nsfs(30, 21, 4026532001, f"{netns_dir}/cni-a"),  # the pin, in the reaper's mount namespace
        nsfs(31, 20, 4026532004, "/run/admin"),  # in the reaper's namespace, not a pin
    ]
    (proc.root / str(os.getpid()) / "mountinfo").write_text("".join(line + "\n" for line in own))
    copy_dir = "21 20 0:25 /netns /host/run/netns rw master:3 - tmpfs tmpfs rw"
    copy = nsfs(60, 21, 4026532001, "/host/run/netns/cni-a")  # a copy of it elsewhere: the same file
    proc.process(100, "copy", [ROOT, RUN, copy_dir, copy])
    holder = [
        ROOT,
        RUN,
        NETNS_DIR,
        nsfs(70, 20, 4026532001, "/run/held"),  # bound onto another file: a holder
        nsfs(71, 21, 4026532002, "/run/netns/cni-a"),  # another namespace on the pin's file
    ]
    proc.process(101, "holder", holder)
    untold = nsfs(80, 99, 4026532003, "/x")  # the file it sits on cannot be told: a holder
    proc.process(102, "untold", [ROOT, untold])
    found = held_mounts((str(netns_dir),), str(proc.root))
    assert {ns.ino: [m.mount_point for m in mounts] for ns, mounts in found.held.items()} == {
        4026532001: ["/run/held"],
        4026532002: ["/run/netns/cni-a"],
        4026532003: ["/x"],
        4026532004: ["/run/admin"],
    }
    # Unlinking the pin's file would detach the other namespace's mount on it: the pin stays.
    assert "another namespace's mount" in found.shared[NsKey(NSFS, 4026532001)]


def test_in_use_joins_processes_and_mounts_and_fails_closed_with_either(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_ns, inside_ns = NsKey(NSFS, 11), NsKey(NSFS, 12)
    monkeypatch.setattr(nsmounts, "busy_namespaces", lambda bin_dirs, only=None: {inside_ns: "pid 5 inside"})
    monkeypatch.setattr(nsmounts, "mount_held", lambda dirs, proc="/proc", parsed=None: {held_ns: "held by a mount"})
    assert in_use((), ()) == {inside_ns: "pid 5 inside", held_ns: "held by a mount"}
    monkeypatch.setattr(nsmounts, "mount_held", lambda dirs, proc="/proc", parsed=None: EveryNamespaceBusy("unseen"))
    assert NsKey(NSFS, 99) in in_use((), ())
    monkeypatch.setattr(nsmounts, "mount_held", lambda dirs, proc="/proc", parsed=None: {held_ns: "held by a mount"})
    monkeypatch.setattr(nsmounts, "busy_namespaces", lambda bin_dirs, only=None: EveryNamespaceBusy("no /proc"))
    assert in_use((), ())[NsKey(NSFS, 99)] == "no /proc"


def test_the_key_is_what_stat_of_the_namespace_gives() -> None:
    """On this kernel: a mount of this process's own netns, as the walk records it, has the key
    os.stat('/proc/self/ns/net') gives (the nsfs device, the inode)."""
    st = os.stat("/proc/self/ns/net")
    line = parse_line(f"50 20 {os.major(st.st_dev)}:{os.minor(st.st_dev)} net:[{st.st_ino}] /x rw - nsfs nsfs rw")
    assert line is not None and (line.dev, int(line.root[5:-1])) == (st.st_dev, st.st_ino)


def test_a_mount_below_a_filesystem_that_may_wait_on_a_process_is_never_walked_to() -> None:
    """A lookup in FUSE (or a network filesystem) can wait on whoever serves it for good: a
    mount whose path crosses one is recorded, and holds its namespace, but `reach` is never
    opened."""
    info = parse_mountinfo(
        [
            ROOT,
            RUN,
            "50 20 0:60 / /run/user/fuse rw - fuse.sshfs host:/ rw",
            "51 50 0:25 /inner /run/user/fuse/dir rw - tmpfs tmpfs rw",  # local, but below FUSE
            nsfs(52, 51, 4026532011, "/run/user/fuse/dir/held"),
            nsfs(53, 20, 4026532012, "/run/held"),
            "54 54 0:61 / /loop rw - tmpfs tmpfs rw",  # its own parent: a namespace's root
            nsfs(55, 54, 4026532013, "/loop/held"),
            nsfs(56, 20, 4026532014, "/run/mnt-pin", kind="mnt"),
            nsfs(57, 51, 4026532015, "/run/user/fuse/dir/mnt-pin", kind="mnt"),
        ]
    )
    assert {line.point: reachable for line, _, reachable in info.net} == {
        "/run/user/fuse/dir/held": False,
        "/run/held": True,
        "/loop/held": True,
    }
    assert info.pinned_mount_namespaces == (
        (4026532014, "/run/mnt-pin", True),
        (4026532015, "/run/user/fuse/dir/mnt-pin", False),
    )


def test_a_pinned_mount_namespace_reached_only_through_fuse_is_not_entered(proc: FakeProc, entering: Entering) -> None:
    proc.process(
        100,
        "other",
        [ROOT, "50 1 0:60 / /fuse rw - fuse fuse rw", nsfs(51, 50, 4026539997, "/fuse/mnt-pin", kind="mnt")],
    )
    with pytest.raises(OSError, match="not walked"):
        every_mount(str(proc.root))
    assert entering.opened == [] and entering.entered == []


def test_a_thread_with_a_mount_namespace_of_its_own_is_read_through_its_id(proc: FakeProc) -> None:
    """unshare(CLONE_NEWNS) in one thread gives it a mount namespace its process does not
    show; each thread of a process with several is looked at."""
    proc.process(100, "host", [ROOT])
    for tid, mount_ns, lines in (
        (100, "host", [ROOT]),
        (101, "host", [ROOT]),
        (102, "thread", [ROOT, RUN, nsfs(60, 20, 4026532020, "/run/thread-held")]),
    ):
        proc.process(100, mount_ns, lines, tid=tid)
    found = [m for m in every_mount(str(proc.root)) if m.mount_point == "/run/thread-held"]
    expected = [(102, proc.ino("thread"), "/proc/102/root/run/thread-held")]
    assert [(m.pid, m.mount_ns, m.reach) for m in found] == expected


def test_a_held_namespaces_mounts_come_reachable_first(
    proc: FakeProc, entering: Entering, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ways to a held namespace are tried in order: by pid (a thread's too, though walked
    with its process), then a protected process's (whose mount namespace, and root, may not be
    looked at), and a mount namespace with no process in it last."""
    held = [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")]
    pinned = entering.namespace("pinned", held)
    proc.process(80, "pinner", [ROOT, RUN, nsfs(41, 20, pinned, "/run/mnt-pin", kind="mnt")])
    proc.process(40, "protected", held)
    proc.process(60, "sixty", held)
    proc.process(50, "fifty", held)
    proc.process(50, "fifty", held, tid=50)
    proc.process(50, "seventy", held, tid=70)
    _hide(monkeypatch, {40})
    found = held_mounts((), str(proc.root)).held[NsKey(NSFS, 4026532009)]
    assert [(m.pid, m.mount_ns) for m in found] == [
        (50, proc.ino("fifty")),
        (60, proc.ino("sixty")),
        (70, proc.ino("seventy")),
        (40, nsmounts.UNKNOWN_NS),
        (nsmounts.NO_PROCESS, pinned),
    ]


def test_a_text_shown_by_many_tasks_that_cannot_be_told_apart_is_parsed_once(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks whose mount namespace may not be looked at (a protected init's threads) are each
    read, since each may be any namespace; the same text is parsed once, and each task still
    names the mounts it shows."""
    lines = [ROOT, RUN, NETNS_DIR, nsfs(30, 21, 4026532001, "/run/netns/cni-a"), nsfs(40, 20, 4026532009, "/run/x")]
    protected = range(100, 140)
    for pid in protected:
        proc.process(pid, f"hidden{pid}", lines)
    _hide(monkeypatch, protected)
    parsed = count_parses(monkeypatch)
    found = every_mount(str(proc.root))
    assert len(parsed) == 2  # this process's text, and the protected tasks' one
    assert sorted(m.pid for m in found if m.mount_point == "/run/x") == list(protected)


def test_a_long_running_walk_parses_only_texts_it_has_not_seen_in_the_walk_before(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")])
    parsed = count_parses(monkeypatch)
    kept = nsmounts.ParsedMountinfo()
    first = held_mounts((), str(proc.root), kept)
    assert len(parsed) == 2 and held_mounts((), str(proc.root), kept) == first and len(parsed) == 2
    # A changed text is parsed again; a text gone for one walk is forgotten.
    (proc.root / "100" / "mountinfo").write_text(f"{ROOT}\n{RUN}\n")
    assert [m.pid for m in every_mount(str(proc.root), kept) if m.mount_point == "/run/held"] == []
    assert len(parsed) == 3
    (proc.root / "100" / "mountinfo").write_text(f"{ROOT}\n{RUN}\n{nsfs(40, 20, 4026532009, '/run/held')}\n")
    assert held_mounts((), str(proc.root), kept) == first and len(parsed) == 4


def test_a_mountinfo_is_split_at_newlines_only() -> None:
    """A mount point may hold a carriage return or a form feed (the kernel escapes only space,
    tab, newline and backslash): such a line stays one line."""
    odd = nsfs(40, 20, 4026532009, "/run/a\rb\x0cc")
    text = f"{ROOT}\n{RUN}\n{odd}\n".encode()
    info = nsmounts.ParsedMountinfo().parse(text, "mountinfo")
    assert [line.point for line, _, _ in info.net] == ["/run/a\rb\x0cc"]


def test_a_mountinfo_over_its_bytes_is_refused_before_more_is_held(
    proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nsmounts, "MAX_MOUNTINFO_BYTES", 100)
    monkeypatch.setattr(nsmounts, "READ_SIZE", 10)
    big = tmp_path / "big"
    big.write_text(ROOT * 3)
    with pytest.raises(OSError) as raised:
        nsmounts._read_text(str(big))
    assert raised.value.errno == errno.EFBIG


def test_held_mounts_answers_as_held_elsewhere_and_pin_files_shared_do(
    proc: FakeProc, entering: Entering, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The judgement made once a text gives the same answers as the two made over every
    record: pins, their copies in other mount namespaces and in protected tasks', mounts
    that hold, another namespace on a pin's file, and a mount namespace no process is in."""
    netns_dir = tmp_path / "netns"
    dirs = (str(netns_dir),)
    run = "20 1 0:25 / /run rw shared:2 - tmpfs tmpfs rw"
    pin_dir = f"21 20 0:25 /netns {netns_dir} rw shared:3 - tmpfs tmpfs rw"
    pins = [nsfs(30 + n, 21, 4026532100 + n, f"{netns_dir}/cni-{n}") for n in range(5)]
    own = [ROOT, run, pin_dir, *pins, nsfs(50, 20, 4026532200, "/run/admin")]
    (proc.root / str(os.getpid()) / "mountinfo").write_text("".join(line + "\n" for line in own))
    copy_dir = "21 20 0:25 /netns /host/netns rw master:3 - tmpfs tmpfs rw"
    copies = [nsfs(60 + n, 21, 4026532100 + n, f"/host/netns/cni-{n}") for n in range(5)]
    shadow = nsfs(70, 21, 4026532300, "/host/netns/cni-1")  # another namespace on pin 1's file
    pinned = entering.namespace("pinned", [ROOT, run, nsfs(41, 20, 4026532400, "/run/held-there")])
    other = [ROOT, run, copy_dir, *copies, shadow, nsfs(71, 20, 4026532100, "/var/held-0")]
    for pid in (100, 101):
        proc.process(pid, "other", [*other, nsfs(72, 20, pinned, "/run/mnt-pin", kind="mnt")])
    for pid in range(110, 114):
        proc.process(pid, f"hidden{pid}", other)
    _hide(monkeypatch, range(110, 114))
    mounts = every_mount(str(proc.root))
    own_ns = proc.ino("host")
    found = held_mounts(dirs, str(proc.root))
    assert found.held == held_elsewhere(mounts, dirs, own_ns)
    assert found.shared == pin_files_shared(mounts, dirs, own_ns)
    assert {ns.ino for ns in found.held} == {4026532100, 4026532200, 4026532300, 4026532400}
    assert list(found.shared) == [NsKey(NSFS, 4026532101)]
    assert dict(mount_held(dirs, str(proc.root))).keys() == {*found.held, *found.shared}
    # Who names one holder gets held_elsewhere's first, with no record made of the others.
    made: list[int] = []
    real_net_mounts = nsmounts._net_mounts

    def counting(
        lines: Iterator[nsmounts._NetLine], pid: int, mount_ns: int, maker: int | None = None
    ) -> Iterator[NsMount]:
        for m in real_net_mounts(lines, pid, mount_ns, maker):
            made.append(pid)
            yield m

    monkeypatch.setattr(nsmounts, "_net_mounts", counting)
    first = held_mounts(dirs, str(proc.root), first_only=True)
    assert first.held == {ns: found[:1] for ns, found in found.held.items()} and first.shared == found.shared
    # The first protected task: its two holders and the mount on pin 1's file; the others
    # showing the same text: only that one, which names the pin that stays.
    assert [made.count(pid) for pid in (110, 111, 112, 113)] == [3, 1, 1, 1]


def test_a_users_mount_namespace_is_parsed_afresh_each_walk_never_kept(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user can make thousands of mount namespaces with thousands of mounts each: the agent
    keeps no parse of theirs from walk to walk."""
    proc.process(100, "users", [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")])
    monkeypatch.setattr(nsmounts, "_users_at", lambda base, ns: base.endswith("/100"))
    parsed = count_parses(monkeypatch)
    kept = nsmounts.ParsedMountinfo()
    for _ in range(3):
        assert [m.pid for m in every_mount(str(proc.root), kept) if m.mount_point == "/run/held"] == [100]
    assert sum(1 for where in parsed if "/100/" in where) == 3
    assert sum(1 for where in parsed if "/100/" not in where) == 1  # root's: kept


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Where each mountinfo text the walk parses from now on was read."""
    parsed: list[str] = []
    real_parse = nsmounts.parse_mountinfo

    def counting(lines: Iterator[str], where: str = "mountinfo") -> nsmounts.MountInfo:
        parsed.append(where)
        return real_parse(lines, where)

    monkeypatch.setattr(nsmounts, "parse_mountinfo", counting)
    return parsed


def _hide(monkeypatch: pytest.MonkeyPatch, protected: Iterable[int]) -> None:
    """Tasks in `protected` show a mountinfo but their mount namespace cannot be told."""
    real = nsmounts._mount_ns
    hidden_ids = {str(task) for task in protected}

    def hidden(base: str) -> int | None:
        return nsmounts.UNKNOWN_NS if base.rsplit("/", 1)[1] in hidden_ids else real(base)

    monkeypatch.setattr(nsmounts, "_mount_ns", hidden)


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    read: list[str] = []
    real = nsmounts._read_open

    def counting(path: str) -> tuple[bytes, int]:
        read.append(Path(path).parent.name)
        return real(path)

    monkeypatch.setattr(nsmounts, "_read_open", counting)
    return read


def test_a_task_that_cannot_be_told_is_not_read_whole_when_its_first_line_is_a_read_namespaces(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A protected init's threads in a namespace some process showed (the same first line, a
    live mount's ID, before and after) are not read whole again; the walk finds the same
    mounts. One whose first line is another namespace's is read whole, and what it holds is
    found."""
    monkeypatch.setattr(nsmounts, "HEAD_MIN_BYTES", 0)
    host_like = ["7 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw", RUN, nsfs(40, 20, 4026532009, "/run/held")]
    proc.process(100, "other", host_like)
    for pid in range(110, 114):
        proc.process(pid, f"hidden{pid}", host_like)
    elsewhere = ["8 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw", RUN, nsfs(41, 20, 4026532010, "/run/secret")]
    proc.process(120, "hidden120", elsewhere)
    _hide(monkeypatch, {*range(110, 114), 120})
    read = _count_reads(monkeypatch)
    found = every_mount(str(proc.root))
    assert sorted(read) == sorted(["100", "120", str(os.getpid())])
    assert {(m.pid, m.mount_point) for m in found} >= {(100, "/run/held"), (120, "/run/secret")}
    monkeypatch.setattr(nsmounts, "MAX_HEADS", 0)  # no shortcut: every task read, the same answer
    everything = held_mounts((), str(proc.root))
    monkeypatch.setattr(nsmounts, "MAX_HEADS", 64)
    assert held_mounts((), str(proc.root)).held.keys() == everything.held.keys()


def test_a_users_namespace_never_vouches_for_a_task_that_cannot_be_told(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its maker can unmount and remount in it at will, so its first line proves nothing."""
    monkeypatch.setattr(nsmounts, "HEAD_MIN_BYTES", 0)
    lines = ["7 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw", RUN, nsfs(40, 20, 4026532009, "/run/held")]
    proc.process(100, "users", lines)
    proc.process(110, "hidden", lines)
    _hide(monkeypatch, {110})
    monkeypatch.setattr(nsmounts, "_users_at", lambda base, mount_ns: base.endswith("/100"))
    read = _count_reads(monkeypatch)
    every_mount(str(proc.root))
    assert "110" in read


def test_a_first_line_vouches_only_while_its_namespace_still_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shown before the task's read but not after (that mount left), or shown by two
    namespaces: the task is read whole."""
    monkeypatch.setattr(nsmounts, "HEAD_MIN_BYTES", 0)
    first = b"7 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\n"
    held_file, task = tmp_path / "held", tmp_path / "task"
    task.mkdir()
    held_file.write_bytes(first + b"rest\n")
    (task / "mountinfo").write_bytes(first + b"other\n")
    heads = nsmounts._Heads()
    try:
        fd = os.open(held_file, os.O_RDONLY)
        assert heads.keep(held_file.read_bytes(), fd)
        assert heads.in_one_read(str(task))
        # A first line past MAX_LINE (a mount point of escapes), or a NUL in it: no whole line
        # matches, so the task is read whole.
        (task / "mountinfo").write_bytes(first[:-1] + b"x" * (nsmounts.MAX_LINE + 2) + b"\n")
        assert not heads.in_one_read(str(task))
        (task / "mountinfo").write_bytes(first[:-1] + b"\0\n")
        assert not heads.in_one_read(str(task))
        (task / "mountinfo").write_bytes(first + b"other\n")
        held_file.write_bytes(b"9 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\nrest\n")  # its first mount left
        assert not heads.in_one_read(str(task))
        held_file.write_bytes(first + b"rest\n")
        twin = os.open(held_file, os.O_RDONLY)
        assert not heads.keep(held_file.read_bytes(), twin)  # a second namespace showing the line
        os.close(twin)
        assert not heads.in_one_read(str(task))
    finally:
        heads.close()
