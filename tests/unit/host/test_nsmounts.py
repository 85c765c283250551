"""The mount walk on fake /proc trees: mountinfo parsed as the kernel escapes it, every mount
namespace read once, bounded, and never a partial answer that would let a held namespace go."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.host import nsmounts
from reaper.host.mounts import parse_line
from reaper.host.nsmounts import (
    NsMount,
    held_elsewhere,
    in_use,
    mount_held,
    netns_mounts,
    parse_mountinfo,
    pin_files_shared,
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

    def process(self, pid: int, mount_ns: str, lines: list[str] | None) -> None:
        base = self.root / str(pid)
        (base / "ns").mkdir(parents=True)
        if mount_ns not in self.namespaces:
            self.namespaces[mount_ns] = self.root / f".mnt-{mount_ns}"
            self.namespaces[mount_ns].touch()
        os.link(self.namespaces[mount_ns], base / "ns" / "mnt")
        if lines is not None:
            (base / "mountinfo").write_text("".join(line + "\n" for line in lines))

    def ino(self, mount_ns: str) -> int:
        return self.namespaces[mount_ns].stat().st_ino


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
    real = nsmounts._read_lines

    def counting(path: str) -> Iterator[str]:
        read.append(path)
        return real(path)

    monkeypatch.setattr(nsmounts, "_read_lines", counting)
    found = netns_mounts(str(proc.root))
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
    real = nsmounts._read_lines

    def vanishing(path: str) -> Iterator[str]:
        if "/100/" in path:
            yield ROOT
            raise FileNotFoundError(errno.ENOENT, "gone", path)  # the process exited mid-read
        yield from real(path)

    monkeypatch.setattr(nsmounts, "_read_lines", vanishing)
    assert [m.pid for m in netns_mounts(str(proc.root)) if m.mount_point == "/run/held"] == [101]


def test_a_walk_that_cannot_be_whole_raises_instead_of_finding_no_mount(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, 4026532009, "/run/held")])
    real = nsmounts._read_lines

    def failing(path: str) -> Iterator[str]:
        if "/100/" in path:
            yield ROOT
            raise OSError(errno.EIO, "I/O error", path)  # not an exit: that namespace is unseen
        yield from real(path)

    monkeypatch.setattr(nsmounts, "_read_lines", failing)
    with pytest.raises(OSError):
        netns_mounts(str(proc.root))
    busy = mount_held((), str(proc.root))
    assert isinstance(busy, EveryNamespaceBusy) and NsKey(NSFS, 4026532009) in busy


def test_a_mount_namespace_pinned_with_no_process_in_it_is_entered_or_the_walk_fails(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "other", [ROOT, RUN, nsfs(40, 20, 4026539999, "/run/mnt-pin", kind="mnt")])
    entered: list[tuple[str, int]] = []

    def enter(path: str, ino: int) -> str:
        entered.append((path, ino))
        return "\n".join([ROOT, RUN, nsfs(41, 20, 4026532010, "/run/held-there"), ""])

    monkeypatch.setattr(nsmounts, "read_entered", enter)
    found = [m for m in netns_mounts(str(proc.root)) if m.mount_point == "/run/held-there"]
    assert entered == [(f"{proc.root}/100/root/run/mnt-pin", 4026539999)]
    assert [(m.pid, m.mount_ns, m.ns) for m in found] == [(nsmounts.NO_PROCESS, 4026539999, NsKey(NSFS, 4026532010))]
    assert "no process in it" in found[0].describe()

    def unenterable(path: str, ino: int) -> str:
        raise OSError(errno.EIO, "mount namespace mnt:[4026539999] cannot be entered")

    monkeypatch.setattr(nsmounts, "read_entered", unenterable)
    with pytest.raises(OSError, match="cannot be entered"):
        netns_mounts(str(proc.root))

    def pinning_another(path: str, ino: int) -> str:
        return "\n".join([ROOT, RUN, nsfs(42, 20, 4026539998, "/run/deeper", kind="mnt"), ""])

    monkeypatch.setattr(nsmounts, "read_entered", pinning_another)
    with pytest.raises(OSError, match="pins another"):
        netns_mounts(str(proc.root))


def test_entering_refuses_a_file_that_is_not_the_namespace_found(tmp_path: Path) -> None:
    plain = tmp_path / "not-a-namespace"
    plain.touch()
    with pytest.raises(OSError) as raised:
        nsmounts.read_entered(str(plain), plain.stat().st_ino + 1)
    assert raised.value.errno == errno.ESTALE


def test_too_many_mount_namespaces_or_a_proc_without_this_process_raise(
    proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for pid in range(100, 104):
        proc.process(pid, f"ns{pid}", [ROOT])
    monkeypatch.setattr(nsmounts, "MAX_MOUNT_NAMESPACES", 3)
    with pytest.raises(OSError, match="more than 3 mount namespaces"):
        netns_mounts(str(proc.root))
    other = tmp_path / "other-proc"
    (other / "1").mkdir(parents=True)
    with pytest.raises(OSError, match="does not list this process"):
        netns_mounts(str(other))


def mount(ns: int, mount_ns: int, point: str, on: tuple[int, str] | None, pid: int = 7) -> NsMount:
    return NsMount(ns=NsKey(NSFS, ns), pid=pid, mount_ns=mount_ns, mount_point=point, on=on)


def test_pins_and_their_copies_on_the_same_file_are_no_holders(tmp_path: Path) -> None:
    netns_dir = tmp_path / "netns"
    netns_dir.mkdir()
    pin_file = (25, "/netns/cni-a")
    mounts = [
        mount(1, 500, f"{netns_dir}/cni-a", pin_file),  # the pin, in the reaper's mount namespace
        mount(1, 600, "/host/run/netns/cni-a", pin_file),  # a copy of it elsewhere: the same file
        mount(1, 700, "/var/held", (8, "/var/held"), pid=9),  # bound onto another file: a holder
        mount(2, 700, "/run/netns/cni-a", pin_file, pid=9),  # another namespace on the pin's file
        mount(3, 800, "/x", None, pid=11),  # the file it sits on cannot be told: a holder
        mount(4, 500, "/tmp/admin", (8, "/tmp/admin")),  # in the reaper's namespace, not a pin
    ]
    held = held_elsewhere(mounts, (str(netns_dir),), 500)
    assert {ns.ino: [m.mount_point for m in found] for ns, found in held.items()} == {
        1: ["/var/held"],
        2: ["/run/netns/cni-a"],
        3: ["/x"],
        4: ["/tmp/admin"],
    }
    # Unlinking the pin's file would detach the other namespace's mount on it: the pin stays.
    assert "another namespace's mount" in pin_files_shared(mounts, (str(netns_dir),), 500)[NsKey(NSFS, 1)]


def test_in_use_joins_processes_and_mounts_and_fails_closed_with_either(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_ns, inside_ns = NsKey(NSFS, 11), NsKey(NSFS, 12)
    monkeypatch.setattr(nsmounts, "busy_namespaces", lambda bin_dirs, only=None: {inside_ns: "pid 5 inside"})
    monkeypatch.setattr(nsmounts, "mount_held", lambda dirs, proc="/proc": {held_ns: "held by a mount"})
    assert in_use((), ()) == {inside_ns: "pid 5 inside", held_ns: "held by a mount"}
    monkeypatch.setattr(nsmounts, "mount_held", lambda dirs, proc="/proc": EveryNamespaceBusy("unseen"))
    assert NsKey(NSFS, 99) in in_use((), ())
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


def test_a_pinned_mount_namespace_reached_only_through_fuse_is_not_entered(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(
        100,
        "other",
        [ROOT, "50 1 0:60 / /fuse rw - fuse fuse rw", nsfs(51, 50, 4026539997, "/fuse/mnt-pin", kind="mnt")],
    )
    monkeypatch.setattr(nsmounts, "read_entered", lambda path, ino: pytest.fail("a FUSE path was walked"))
    with pytest.raises(OSError, match="not walked"):
        netns_mounts(str(proc.root))


def test_a_thread_with_a_mount_namespace_of_its_own_is_read_through_its_id(proc: FakeProc) -> None:
    """unshare(CLONE_NEWNS) in one thread gives it a mount namespace its process does not
    show; each thread of a process with several is looked at."""
    proc.process(100, "host", [ROOT])
    task = proc.root / "100" / "task"
    for tid, mount_ns, lines in (
        (100, "host", [ROOT]),
        (101, "host", [ROOT]),
        (102, "thread", [ROOT, RUN, nsfs(60, 20, 4026532020, "/run/thread-held")]),
    ):
        (task / str(tid) / "ns").mkdir(parents=True)
        if mount_ns not in proc.namespaces:
            proc.namespaces[mount_ns] = proc.root / f".mnt-{mount_ns}"
            proc.namespaces[mount_ns].touch()
        os.link(proc.namespaces[mount_ns], task / str(tid) / "ns" / "mnt")
        (task / str(tid) / "mountinfo").write_text("".join(line + "\n" for line in lines))
    found = [m for m in netns_mounts(str(proc.root)) if m.mount_point == "/run/thread-held"]
    expected = [(102, proc.ino("thread"), "/proc/102/root/run/thread-held")]
    assert [(m.pid, m.mount_ns, m.reach) for m in found] == expected


def test_a_held_namespaces_mounts_come_reachable_first() -> None:
    """The ways to a held namespace are tried in order: a protected process's (whose mount
    namespace, and root, may not be looked at) come after those that can be walked, and a
    mount namespace with no process in it last."""
    on = (8, "/var/held")
    mounts = [
        mount(9, nsmounts.UNKNOWN_NS, "/var/held", on, pid=1),
        mount(9, 600, "/var/held", on, pid=0),
        mount(9, 500, "/var/held", on, pid=40),
        mount(9, 500, "/var/held", on, pid=2),
    ]
    held = held_elsewhere(mounts, (), 500)
    assert [(m.pid, m.mount_ns) for m in held[NsKey(NSFS, 9)]] == [(2, 500), (40, 500), (1, 0), (0, 600)]
