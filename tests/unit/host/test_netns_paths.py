"""The rule for a netns path a file names: looked at only as a pin directly in a netns dir, or
as /proc/<pid>/ns/net; anything else is refused with a reason and never touched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import example
from hypothesis import given as for_any
from hypothesis import strategies as st

from reaper.host.netns_paths import GONE, NAME_MAX, PATH_MAX, NetnsPlaces, _not_plain, cached_stat
from reaper.model import NsKey
from tests.harness.fuzz import FUZZ


@pytest.fixture
def netns_dir(tmp_path: Path) -> Path:
    d = tmp_path / "netns"
    d.mkdir()
    return d


def _refused(places: NetnsPlaces, path: str) -> str:
    found = places.look(path)
    assert found.key is None and not found.uninspectable, found
    assert found.refused is not None and found.refused.startswith("not looked at"), found
    assert "\n" not in found.refused
    return found.refused


def hostile(netns: Path) -> list[str]:
    pid = os.getpid()
    return [
        "relative/net",
        "net",
        "/proc/self/ns/net",
        "/proc/thread-self/ns/net",
        f"/proc/{pid}/task/{pid}/ns/net",
        "/proc/0001/ns/net",
        "/proc/1/root/etc/passwd",
        f"/proc/1/root{netns}/cni-1",
        f"/proc/{pid}/root{netns}/cni-1",
        f"/proc/{pid}/cwd/net",
        f"/proc/{pid}/ns/../ns/net",
        f"/proc/{pid}/ns/net/",
        "/proc/1/ns/mnt",
        "/proc/" + "9" * 11 + "/ns/net",
        f"{netns}/../../etc/passwd",
        f"{netns}/./cni-1",
        f"{netns}//cni-1",
        f"/{netns}/cni-1",
        f"{netns}/sub/cni-1",
        f"{netns}/" + "a" * 256,
        "/" + "a/" * 2100 + "net",
        f"{netns}/cni\0-1",
        f"{netns}/cni-\ud800",
        "/dev/fuse",
        "/",
    ]


@pytest.mark.parametrize("index", range(len(hostile(Path("/x")))))
def test_hostile_paths_are_refused_without_a_look(netns_dir: Path, index: int) -> None:
    (netns_dir / "sub").mkdir()
    path = hostile(netns_dir)[index]
    with NetnsPlaces([str(netns_dir)]) as places:
        _refused(places, path)


def test_nothing_below_a_netns_dir_is_looked_at_when_none_is_given(netns_dir: Path) -> None:
    (netns_dir / "cni-1").touch()
    with NetnsPlaces([]) as places:
        assert "none given" in _refused(places, f"{netns_dir}/cni-1")


def test_a_symlink_in_the_netns_dir_is_not_followed(netns_dir: Path) -> None:
    (netns_dir / "cni-1").symlink_to("/proc/self/ns/net")
    with NetnsPlaces([str(netns_dir)]) as places:
        assert "symlink" in _refused(places, f"{netns_dir}/cni-1")


def test_a_netns_dir_that_is_a_symlink_is_not_entered(tmp_path: Path, netns_dir: Path) -> None:
    (netns_dir / "cni-1").touch()
    link = tmp_path / "link"
    link.symlink_to(netns_dir)
    with NetnsPlaces([str(link)]) as places:
        assert "symlink" in _refused(places, f"{link}/cni-1")


def test_a_netns_dir_on_no_local_filesystem_is_not_looked_into() -> None:
    """procfs stands in for FUSE or NFS: a filesystem that is not a known local one."""
    with NetnsPlaces(["/proc/sys"]) as places:
        assert "f_type 0x9fa0" in _refused(places, "/proc/sys/net")


def test_a_proc_that_is_no_procfs_is_not_looked_into(tmp_path: Path) -> None:
    (tmp_path / str(os.getpid()) / "ns").mkdir(parents=True)
    (tmp_path / str(os.getpid()) / "ns" / "net").touch()
    with NetnsPlaces([], proc=str(tmp_path)) as places:
        assert "no procfs" in _refused(places, f"/proc/{os.getpid()}/ns/net")


def test_a_process_namespace_is_what_stat_says(netns_dir: Path) -> None:
    path = f"/proc/{os.getpid()}/ns/net"
    st = os.stat(path)
    with NetnsPlaces([str(netns_dir)]) as places:
        assert places.look(path) == (NsKey(st.st_dev, st.st_ino), False, None)
        assert places.look("/proc/999999999/ns/net") == GONE


def test_a_stale_pin_and_a_missing_one(netns_dir: Path) -> None:
    """A stale pin (a plain file, nothing mounted on it) names itself, as a stat said before;
    a missing one names nothing. Neither is refused."""
    (netns_dir / "cni-1").touch()
    st = os.lstat(netns_dir / "cni-1")
    with NetnsPlaces([str(netns_dir)]) as places:
        assert places.look(f"{netns_dir}/cni-1") == (NsKey(st.st_dev, st.st_ino), False, None)
        assert places.look(f"{netns_dir}/cni-2") == GONE
        assert places.look(None) == places.look("") == GONE


def test_a_missing_netns_dir_holds_nothing(tmp_path: Path) -> None:
    with NetnsPlaces([str(tmp_path / "none")]) as places:
        assert places.look(f"{tmp_path}/none/cni-1") == GONE


@pytest.mark.skipif(os.path.realpath("/var/run") != "/run", reason="/var/run is no link to /run here")
def test_var_run_and_run_are_one_when_they_are_one_here() -> None:
    """containerd and CRI-O write /var/run/netns/..., podman /run/netns/...: both are looked
    up in the one dir, whichever spelling was given."""
    for given in ("/var/run/netns", "/run/netns"):
        with NetnsPlaces([given]) as places:
            for written in ("/var/run/netns/cni-none-such", "/run/netns/netns-none-such"):
                assert places.look(written).refused is None


def test_cached_stat_agrees_with_lstat(netns_dir: Path) -> None:
    (netns_dir / "f").touch()
    fd = os.open(netns_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        st = os.lstat(netns_dir / "f")
        found = cached_stat(fd, "f", follow=False)
        assert (found.mode, found.dev, found.ino) == (st.st_mode, st.st_dev, st.st_ino)
        assert cached_stat(fd, "", follow=False).ino == os.stat(netns_dir).st_ino
    finally:
        os.close(fd)


def _not_plain_by_normpath(path: str) -> str | None:
    """The refusal as os.fsencode and os.path.normpath give it: what _not_plain must answer."""
    try:
        size = len(os.fsencode(path))
    except UnicodeEncodeError:
        return "not looked at: not a path (an unencodable character)"
    if "\0" in path:
        return "not looked at: not a path (a NUL)"
    if size >= PATH_MAX:
        return f"not looked at: {size} bytes, longer than any path"
    if not path.startswith("/") or os.path.normpath(path) != path or path.startswith("//"):
        return "not looked at: not a plain absolute path"
    if len(os.fsencode(os.path.basename(path))) > NAME_MAX:
        return "not looked at: a name longer than any file's"
    return None


_PARTS = st.sampled_from(["", ".", "..", "...", "a", "cni-1", "\u00e9", "\udcff", "\0", "x" * 255, "\u00e9" * 128])


@FUZZ
@for_any(st.lists(_PARTS, max_size=6).map("/".join) | st.text(alphabet="/.a\u00e9\udcff\0", max_size=12))
@example("/")
@example("//a")
@example("///a")
@example("/a/")
@example("/a/../b")
@example("/a/./b")
@example("/" + "a/" * 2047 + "b")
@example("/" + "\u00e9" * 128)
@example("/" + "\u00e9" * 127 + "a")
def test_a_path_is_refused_as_normpath_and_fsencode_would_refuse_it(path: str) -> None:
    assert _not_plain(path) == _not_plain_by_normpath(path)
    assert _not_plain("/" + path) == _not_plain_by_normpath("/" + path)


def test_a_pin_is_looked_up_by_its_dirname_and_basename(netns_dir: Path) -> None:
    (netns_dir / "cni-1").write_text("")
    with NetnsPlaces([str(netns_dir)]) as places:
        assert places.look(f"{netns_dir}/cni-1").key is not None
        assert places.look(f"{netns_dir}/cni-2") == GONE
        assert places.look("/cni-1").refused is not None  # the root is no netns dir
        assert places.look(f"{netns_dir}x/cni-1").refused is not None
