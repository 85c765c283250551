"""The pass walks one way: look (processes and holders included), ask the runtimes, correlate,
reconcile, save. Traced on a pass over a scratch node: the rooms (reaper modules) of the
functions scan_pass and its private helpers call, repeats collapsed."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from reaper import scan
from reaper.scan import scan_pass
from reaper.settings import Settings
from reaper.state import KeptState
from tests.harness.scratch import scratch_settings
from tests.harness.snapshots import cid, runtime
from tests.harness.static_liveness import StaticLiveness

# The pass's own helpers, its timer and the records' methods are the pass itself, not a room.
NOT_ROOMS = frozenset({"reaper.scan", "reaper.stopwatch", "reaper.model"})
RUNTIMES = "the runtimes"  # the liveness source's room, wherever a test's fake lives
MAX_RETURNS = 3


def walk(settings: Settings, kept: KeptState | None) -> list[str]:
    """The rooms one pass walks through, in order, a room entered again at once counted once."""
    liveness = StaticLiveness(runtime())  # answered, listing no sandbox
    rooms: list[str] = []

    def record(frame: FrameType, event: str, _arg: Any) -> None:
        caller = frame.f_back
        if event != "call" or caller is None or caller.f_code.co_filename != scan.__file__:
            return
        module = str(frame.f_globals.get("__name__", ""))
        if module == type(liveness).__module__:
            rooms.append(RUNTIMES)
        elif module.startswith("reaper.") and module not in NOT_ROOMS:
            rooms.append(module)

    sys.setprofile(record)
    try:
        result = scan_pass(settings, liveness, logging.getLogger("test"), kept=kept)
    finally:
        sys.setprofile(None)
    assert [a.verdict for a in result.report.attachments] == ["live"]  # its netns is the host's
    return [room for n, room in enumerate(rooms) if n == 0 or rooms[n - 1] != room]


def returns(rooms: list[str]) -> int:
    """How many times the walk enters a room it left before."""
    return sum(1 for n, room in enumerate(rooms) if room in rooms[:n])


def node(work: Path) -> Settings:
    """A scratch node with one cache entry whose netns is a real one (this process's, through
    /proc/<pid>/ns/net) that no sandbox names: who is inside it could decide its verdict."""
    settings = scratch_settings(work)
    conf = {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "bridge"}]}
    (work / "conf" / "10-net.conflist").write_text(json.dumps(conf))
    entry = {
        "kind": "cniCacheV1",
        "containerId": cid(1),
        "networkName": "net",
        "ifName": "eth0",
        "netns": f"/proc/{os.getpid()}/ns/net",
        "result": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "x"}]},
    }
    (work / "cache" / "results").mkdir()
    (work / "cache" / "results" / f"net-{cid(1)}-eth0").write_text(json.dumps(entry))
    return settings


@pytest.mark.parametrize("run", ["one-shot", "agent"])
def test_the_pass_reads_the_node_before_the_runtimes_and_returns_to_a_room_at_most_3_times(
    tmp_path: Path, run: str
) -> None:
    """Before: the runtimes were asked, then the pass went back to the look for the processes and
    their holders, between correlate and reconcile (one-shot: 5 returns, agent: 4)."""
    settings = node(tmp_path)
    kept = None
    if run == "agent":
        kept = KeptState()
        scan_pass(settings, StaticLiveness(runtime()), logging.getLogger("test"), kept=kept)
    rooms = walk(settings, kept)
    assert returns(rooms) <= MAX_RETURNS, f"{returns(rooms)} returns: {' -> '.join(rooms)}"
    looked = [n for n, room in enumerate(rooms) if room == "reaper.snapshot" or room.startswith("reaper.host.")]
    assert RUNTIMES in rooms and max(looked) < rooms.index(RUNTIMES), rooms
