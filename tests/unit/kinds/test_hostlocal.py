"""host-local leases: the file formats of every plugin version, and any bytes at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.kinds.hostlocal import collect_leases, ip_key, parse_lease
from reaper.names import is_cni_id, is_ifname
from tests.harness.fuzz import FUZZ

CID = "a" * 64


def test_lease_formats() -> None:
    assert parse_lease(f"{CID}\r\neth0".encode()) == (CID, "eth0")
    assert parse_lease(f"{CID}\n".encode()) == (CID, None)
    assert parse_lease(f"  {CID}  ".encode()) == (CID, None)
    for bad in (
        b"",
        b"\r\n",
        b"\xff\xfe",
        f"{CID}\r\neth0\r\nextra".encode(),
        b"../../etc\r\neth0",
        f"{CID}\r\na/b".encode(),
    ):
        with pytest.raises(ValueError):
            parse_lease(bad)


@FUZZ
@given(st.binary(max_size=300))
def test_lease_parser_takes_any_bytes(data: bytes) -> None:
    try:
        cid, ifname = parse_lease(data)
    except ValueError:
        return
    assert is_cni_id(cid) and (ifname is None or is_ifname(ifname))


@FUZZ
@given(st.text(max_size=50))
def test_ip_key_takes_any_text(text: str) -> None:
    key = ip_key(text)
    assert key is None or key[0] in (4, 6)


def test_hostile_lease_files_never_become_records(tmp_path: Path) -> None:
    ipam = tmp_path / "ipam"
    (ipam / "net1").mkdir(parents=True)
    (ipam / "net1" / "10.0.0.2").write_bytes(b"../../etc/passwd\r\neth0")
    (ipam / "net1" / "10.0.0.3").write_bytes(f"{CID}\r\neth0\n".encode() + b"\xff")
    (ipam / "net1" / "10.0.0.4").write_bytes(b"a b c\r\neth0")
    (ipam / "net1" / "10.0.0.5").write_bytes(f"{CID}\r\n../eth0".encode())
    (ipam / "bad net").mkdir()
    leases, corrupt = collect_leases([str(ipam)])
    assert leases == []
    assert len(corrupt) == 5
