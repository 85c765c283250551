"""Names read from disk or a runtime: container IDs, network names, ifnames, pin names."""

from __future__ import annotations

from pathlib import Path

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


def test_a_12_hex_pin_is_never_runtime_named_even_in_dockers_netns_dir(tmp_path: Path) -> None:
    """Plain Docker containers pin there too and no CRI runtime lists them: a 12-hex pin is
    reported, and goes only with an attachment a cache entry or sandbox names."""
    docker, admin = tmp_path / "docker-netns", tmp_path / "netns"
    for directory in (docker, admin):
        directory.mkdir()
        (directory / "0123456789ab").write_bytes(b"")
    pins, _ = collect_pins((str(docker), str(admin)), compile_netns_patterns(()))
    assert {(p.directory, p.runtime_named) for p in pins} == {(str(docker), False), (str(admin), False)}
    assert not is_runtime_netns_name("0123456789ab", compile_netns_patterns(()))
