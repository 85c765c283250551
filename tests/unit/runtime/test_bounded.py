"""What a runtime answers is bounded: a list over 16 MiB or over 100,000 sandboxes is that
runtime's error, memory stays bounded while it is refused, and PodSandboxStatus is asked only
for the sandboxes whose netns the pass needs, a few at a time, all within one deadline. Each
runtime is a real grpc server (tests/harness/fake_cri.py)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from reaper.runtime.client import MAX_ANSWER, MAX_SANDBOXES, MAX_STATUS_ANSWER
from reaper.runtime.cri import STATUS_IN_FLIGHT, CriLiveness
from tests.harness.cri import api_pb2 as pb
from tests.harness.fake_cri import FakeRuntime, sandbox, sandbox_list
from tests.harness.probe import probe_argv
from tests.harness.probes import cri_observe

# The chart's memory limit for the agent; the client's peak must stay well under it.
CHART_LIMIT_KIB = 256 * 1024


def observe_in_child(endpoint: str) -> dict[str, Any]:
    proc = subprocess.run(probe_argv(cri_observe, endpoint), capture_output=True, text=True, timeout=120, check=True)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def tiny_items(count: int) -> bytes:
    """A ListPodSandboxResponse of `count` empty items: two bytes each on the wire, an object
    of a few hundred bytes each decoded."""
    return b"\x0a\x00" * count


@pytest.fixture(scope="module")
def baseline_kib(tmp_path_factory: pytest.TempPathFactory) -> int:
    """The client's peak when its runtime lists nothing."""
    with FakeRuntime(tmp_path_factory.mktemp("cri") / "empty.sock", b"", {}) as runtime:
        out = observe_in_child(runtime.endpoint)
    assert out["reachable"], out
    peak: int = out["peak_kib"]
    return peak


def test_a_list_over_16_mib_is_that_runtimes_error_and_memory_stays_bounded(tmp_path: Path, baseline_kib: int) -> None:
    """grpc refuses it from its length prefix: the answer is neither taken in nor decoded. (Three
    times the cap: under the 64 MiB the client took before.)"""
    listed = sandbox_list([pb.PodSandbox(id="a" * (3 * MAX_ANSWER))])
    with FakeRuntime(tmp_path / "huge.sock", listed, {}) as runtime:
        out = observe_in_child(runtime.endpoint)
        assert runtime.calls["PodSandboxStatus"] == 0
    assert not out["reachable"], out
    assert out["error"].count("\n") == 0 and "ListPodSandbox on unix://" in out["error"]
    assert "RESOURCE_EXHAUSTED" in out["error"]
    assert out["peak_kib"] - baseline_kib < 32 * 1024 and out["peak_kib"] < CHART_LIMIT_KIB // 2, out


@pytest.mark.parametrize("count", [2 << 20, MAX_SANDBOXES + 1], ids=["4-mib-of-tiny-items", "one-too-many"])
def test_more_than_100000_sandboxes_is_that_runtimes_error_and_memory_stays_bounded(
    tmp_path: Path, baseline_kib: int, count: int
) -> None:
    """4 MiB of tiny items (what took a client past the chart's limit), and one item too many."""
    with FakeRuntime(tmp_path / "many.sock", tiny_items(count), {}) as runtime:
        out = observe_in_child(runtime.endpoint)
        assert runtime.calls["PodSandboxStatus"] == 0
    assert not out["reachable"], out
    assert out["error"] == f"ListPodSandbox on unix://{tmp_path}/many.sock: more than 100,000 sandboxes"
    assert out["peak_kib"] - baseline_kib < 32 * 1024 and out["peak_kib"] < CHART_LIMIT_KIB // 2, out


def test_100000_sandboxes_are_a_list(tmp_path: Path) -> None:
    with FakeRuntime(tmp_path / "full.sock", tiny_items(MAX_SANDBOXES), {}) as runtime:
        out = observe_in_child(runtime.endpoint)
    assert out["reachable"] and out["listed"] == [MAX_SANDBOXES], out


def test_pod_sandbox_status_is_asked_only_for_what_the_pass_needs_a_few_at_a_time(tmp_path: Path) -> None:
    """Ready and NotReady sandboxes alike (a NotReady one's pin is still its own), each ID once
    however often it is listed, none whose netns an earlier answer gave."""
    ready = [sandbox(f"r{i:02}") for i in range(30)]
    notready = [sandbox(f"n{i:02}", ready=False) for i in range(10)]
    items = ready + notready
    known = {f"{s.id}@{s.created_at}": f"/run/netns/known-{s.id}" for s in items[::3]}
    netns = {s.id: f"/run/netns/asked-{s.id}" for s in items}
    with FakeRuntime(tmp_path / "cri.sock", sandbox_list(items + items), netns, status_delay=0.02) as runtime:
        view = CriLiveness((runtime.endpoint,), 10.0).observe(known)
        asked = list(runtime.status_ids)
        most = runtime.most_at_once
    needed = [s.id for s in items if f"{s.id}@{s.created_at}" not in known]
    assert sorted(asked) == sorted(needed) and len(asked) == len(set(asked))
    assert 1 < most <= STATUS_IN_FLIGHT
    assert view.reachable, view.error
    by_id = {s.id: s.netns_path for s in view.sandboxes}
    for s in items:
        told = known.get(f"{s.id}@{s.created_at}")
        assert by_id[s.id] == (told or f"/run/netns/asked-{s.id}")


def test_every_pod_sandbox_status_is_answered_within_one_deadline(tmp_path: Path) -> None:
    """A runtime that answers each status slowly enough that all of them together take many
    deadlines: the batch ends at the one deadline, as that runtime's error."""
    items = [sandbox(f"s{i:03}") for i in range(100)]
    netns = {s.id: f"/run/netns/{s.id}" for s in items}
    timeout = 0.5
    with FakeRuntime(tmp_path / "slow.sock", sandbox_list(items), netns, status_delay=0.1) as runtime:
        started = time.monotonic()
        view = CriLiveness((runtime.endpoint,), timeout).observe({})
        took = time.monotonic() - started
        asked = runtime.calls["PodSandboxStatus"]
    assert not view.reachable and view.error is not None
    assert "PodSandboxStatus on unix://" in view.error and "DEADLINE_EXCEEDED" in view.error
    assert asked < len(items) and took < 4 * timeout


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/run/netns/" + "x" * 5000, "a netns path over 4096 bytes"),
        ("/run/netns/" + "x" * MAX_STATUS_ANSWER, "RESOURCE_EXHAUSTED"),
    ],
    ids=["netns-path", "status-answer"],
)
def test_a_status_answer_or_netns_path_past_its_bound_is_that_runtimes_error(
    tmp_path: Path, path: str, error: str
) -> None:
    with FakeRuntime(tmp_path / "cri.sock", sandbox_list([sandbox("s")]), {"s": path}) as runtime:
        view = CriLiveness((runtime.endpoint,), 10.0).observe({})
    assert not view.reachable and view.error is not None
    assert view.error.startswith(f"PodSandboxStatus on {runtime.endpoint}: ") and error in view.error
    assert "\n" not in view.error
