"""Tying veths to the pinned namespace their peer is in, by nsid. Pure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper.host.memo import InventoryMemo
from reaper.host.netlink import RawLink, dump_links
from reaper.kinds import Look, veth
from reaper.kinds.veth import veths_from
from reaper.model import NetnsPin, NsKey
from tests.harness.passes import options_at


def _pin(name: str, ino: int) -> NetnsPin:
    return NetnsPin(name, f"/run/netns/{name}", "/run/netns", NsKey(4, ino), True, 0.0, True)


def _veth(name: str, index: int, nsid: int | None) -> RawLink:
    return RawLink(index, name, "veth", 2, None, nsid)


def test_a_veth_joins_the_pin_whose_nsid_is_its_peers() -> None:
    pins = [_pin("a", 10), _pin("b", 11)]
    nsids = [(NsKey(4, 10), 0), (NsKey(4, 11), 1)]
    veths = veths_from([_veth("va", 5, 0), _veth("vb", 6, 1), _veth("vx", 7, 9)], nsids, pins)
    assert {v.name: v.peer_netns for v in veths} == {"va": NsKey(4, 10), "vb": NsKey(4, 11), "vx": None}


def test_an_nsid_two_namespaces_claim_ties_neither() -> None:
    # Only a stale answer could say so; neither namespace may then take the veth.
    pins = [_pin("a", 10), _pin("b", 11)]
    nsids = [(NsKey(4, 10), 3), (NsKey(4, 11), 3)]
    veths = veths_from([_veth("v", 5, 3)], nsids, pins)
    assert [v.peer_netns for v in veths] == [None]


def test_an_nsid_of_a_namespace_no_pin_holds_ties_nothing() -> None:
    # The pin was swapped between the netns kind's look and the nsid request.
    nsids = [(NsKey(4, 99), 0)]
    veths = veths_from([_veth("v", 5, 0)], nsids, [_pin("a", 10)])
    assert [v.peer_netns for v in veths] == [None]


def test_a_dump_that_fails_on_its_thread_is_the_kinds_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refused() -> tuple[int, list[bytes]]:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(veth, "dump_links_raw", refused)
    opts = options_at(tmp_path)
    dump = veth.LinkDump(opts)
    found = veth.find(Look(opts, InventoryMemo(), (), {}, dump))
    dump.close()
    assert found.records == ()
    assert [(e.source, e.error) for e in found.errors] == [("netlink", "[Errno 1] Operation not permitted")]


def test_a_bug_on_the_dump_thread_is_raised_on_the_looks_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Not a traceback on stderr and no veths: the snapshot reports the kind as failed.
    def broken() -> tuple[int, list[bytes]]:
        raise ValueError("bad answer")

    monkeypatch.setattr(veth, "dump_links_raw", broken)
    dump = veth.LinkDump(options_at(tmp_path))
    with pytest.raises(ValueError, match="bad answer"):
        dump.links()


def test_a_one_shots_forked_dump_gives_the_links_the_in_process_one_does(tmp_path: Path) -> None:
    forked_opts = replace(options_at(tmp_path), fork_workers=True)
    dump = veth.LinkDump(forked_opts)
    try:
        child = dump._forked.pid if dump._forked is not None else None
        assert child is not None  # a child decodes the dump
        assert dump.links().links == dump_links()
    finally:
        dump.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # reaped


def test_a_forked_dump_that_fails_is_the_kinds_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refused() -> list[RawLink]:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(veth, "dump_links", refused)
    opts = replace(options_at(tmp_path), fork_workers=True)
    dump = veth.LinkDump(opts)
    found = veth.find(Look(opts, InventoryMemo(), (), {}, dump))
    dump.close()
    assert found.records == ()
    assert [(e.source, e.error) for e in found.errors] == [("netlink", "[Errno 1] Operation not permitted")]
