"""Names read from disk or a runtime: container IDs, network names, ifnames, pin names."""

from __future__ import annotations

from pathlib import Path

from pytest import MonkeyPatch

from reaper import names
from reaper.kinds.netns import collect_pins
from reaper.names import compile_netns_patterns, is_cni_id, is_ifname, is_runtime_netns_name

CID = "a" * 64


def test_names() -> None:
    assert is_cni_id(CID) and is_cni_id("my-net.v2_x")
    for bad in ("", "../x", "a/b", "a b", "-lead", "x\n", ".hidden"):
        assert not is_cni_id(bad), bad
    assert is_ifname("eth0") and not is_ifname("a" * 16) and not is_ifname("..") and not is_ifname("a:b")
    patterns = compile_netns_patterns(("test-.*",))
    assert is_runtime_netns_name("cni-1b2c3d4e-aaaa-bbbb-cccc-0123456789ab", patterns)
    assert is_runtime_netns_name("1b2c3d4e-aaaa-bbbb-cccc-0123456789ab", patterns)
    assert is_runtime_netns_name("test-1", patterns)
    assert not is_runtime_netns_name("cni-not-a-uuid", patterns)
    assert not is_runtime_netns_name("lab", patterns)


def test_an_ifname_with_a_control_byte_is_no_ifname() -> None:
    for bad in ("eth\x000", "eth\n0", "\x7f", "a\tb"):
        assert not is_ifname(bad), repr(bad)


def test_a_12_hex_pin_is_runtime_named_only_in_dockers_netns_dir() -> None:
    patterns = compile_netns_patterns(())
    for docker in ("/var/run/docker/netns", "/run/docker/netns/"):
        assert is_runtime_netns_name("0123456789ab", patterns, docker)
        assert not is_runtime_netns_name("0123456789abc", patterns, docker)  # 13 digits
        assert not is_runtime_netns_name("0123456789AB", patterns, docker)  # Docker writes lower case
        assert not is_runtime_netns_name("default", patterns, docker)  # Docker's own, not a sandbox's
    assert not is_runtime_netns_name("0123456789ab", patterns, "/var/run/netns")  # an admin may name one so
    assert not is_runtime_netns_name("0123456789ab", patterns)


def test_pins_in_dockers_dir_are_runtime_named_by_the_dir_they_are_in(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    docker, admin = tmp_path / "docker-netns", tmp_path / "netns"
    for directory in (docker, admin):
        directory.mkdir()
        (directory / "0123456789ab").write_bytes(b"")
    monkeypatch.setattr(names, "DOCKER_NETNS_DIRS", (str(docker),))
    pins, _ = collect_pins((str(docker), str(admin)), compile_netns_patterns(()))
    assert {(p.directory, p.runtime_named) for p in pins} == {(str(docker), True), (str(admin), False)}
