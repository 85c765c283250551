"""A bug in one kind, or one bad record, costs that kind or that record, never the whole pass."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from reaper.kinds import Found, Kind, Look, ReclaimContext
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import Done, Identity, ResourceRef
from reaper.options import FindOptions
from reaper.snapshot import take_snapshot
from tests.harness.passes import bare_reclaimer


def _boom_find(look: Look) -> Found[str]:
    raise KeyError("a bug")


def _reclaim(records: Sequence[str], ctx: ReclaimContext) -> Mapping[Identity, Done]:
    if "bad" in records:
        raise ValueError("cannot handle 'bad'")
    return {("toy", r): Done.freed() for r in records}


TOY: Kind[str] = Kind(
    name="toy",
    find=_boom_find,
    identity=lambda r: ("toy", r),
    ref=lambda r: ResourceRef(kind="toy", name=r, created_at=None),
    tie=lambda r: None,
    reclaim=_reclaim,
)


def test_a_find_that_raises_is_that_kinds_error_and_the_others_are_read(tmp_path: Path) -> None:
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    (results / ("net1-" + "a" * 64 + "-eth0")).write_text("{}")
    options = FindOptions(
        netns_dirs=(),
        ipam_dirs=(),
        cache_dir=str(tmp_path / "cache"),
        conf_dir=str(tmp_path / "none"),
        bin_dirs=(),
        netns_patterns=(re.compile("x"),),
    )
    taken = take_snapshot(options, registry=Registry(kinds=(TOY, *REGISTRY.kinds)))
    assert [e.source for e in taken.errors if "unexpectedly" in e.error] == ["toy"]
    assert taken.of("toy") == ()
    assert any(c.kind == "cache" for c in taken.corrupt), "the kinds after it were still read"


def test_one_record_that_makes_reclaim_raise_is_left_and_the_rest_are_freed() -> None:
    reclaimer = bare_reclaimer()
    ctx = ReclaimContext(
        netns_dirs=(), bin_dirs=(), live_netns=frozenset(), quarantine=None, command_timeout=1.0, done={}
    )
    done = reclaimer._reclaim_isolated(TOY, ["a", "bad", "b"], ctx)
    assert done[("toy", "a")].ok and done[("toy", "b")].ok
    assert not done[("toy", "bad")].ok and "cannot handle" in str(done[("toy", "bad")].error)
