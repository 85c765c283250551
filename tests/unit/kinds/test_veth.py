"""Tying veths to the pinned namespace their peer is in, by nsid. Pure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reaper.host.memo import InventoryMemo
from reaper.host.netlink import DumpInterrupted, RawLink
from reaper.kinds import Look, veth
from reaper.kinds.netns import NetnsPin
from reaper.kinds.veth import veths_from
from reaper.model import NsKey
from tests.harness.passes import options_at


def _pin(name: str, ino: int) -> NetnsPin:
    return NetnsPin(
        name=name,
        path=f"/run/netns/{name}",
        directory="/run/netns",
        ns=NsKey(4, ino),
        is_namespace=True,
        mtime=0.0,
        runtime_named=True,
    )


def _veth(name: str, index: int, nsid: int | None) -> RawLink:
    return RawLink(ifindex=index, name=name, kind="veth", link=2, master=None, link_netnsid=nsid)


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


@pytest.mark.parametrize(
    "error",
    [PermissionError(1, "Operation not permitted"), DumpInterrupted(11, "the kernel interrupted the dump")],
    ids=["refused", "interrupted"],
)
def test_a_dump_that_fails_is_the_kinds_error_and_no_veth(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: OSError
) -> None:
    def failing() -> list[RawLink]:
        raise error

    monkeypatch.setattr(veth, "dump_links", failing)
    found = veth.find(Look(options_at(tmp_path), InventoryMemo(), (), {}))
    assert found.records == ()
    assert [(e.source, e.error) for e in found.errors] == [("netlink", str(error))]


class _LookedUpOnly(set[int]):
    """The nsids the pins answered, which may be asked about but never walked: walking them
    for each veth was a step per veth per pin."""

    def __iter__(self) -> Iterator[int]:
        raise AssertionError("the known nsids were walked")


def test_whether_a_veth_is_in_a_namespace_no_pin_names_is_a_lookup_per_veth(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def nsids_of(paths: list[str]) -> dict[str, object]:
        asked.append(paths)
        return {}

    monkeypatch.setattr(veth, "nsids_of", nsids_of)
    links = [_veth(f"v{n}", n, n) for n in range(50)]
    assert veth._held_nsids(links, (), _LookedUpOnly(range(50))) == {} and asked == []
    assert veth._held_nsids([*links, _veth("vx", 99, 99)], (), _LookedUpOnly(range(50))) == {}
