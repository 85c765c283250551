"""The agent with its passes faked and a fake clock: what each pass outcome does to the metrics,
readiness and health, the stop flag, and a whole run from start to a clean stop."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from reaper import agent as agent_module
from reaper.agent import READY_INTERVALS, Agent
from reaper.host.passlock import LockBusy, take_lock
from reaper.metrics import installed_version
from reaper.model import HostUnseen, NsKey, ReapResult, ScanResult
from reaper.reap.plan import breaker_would_trip
from reaper.settings import AgentSettings
from reaper.snapshot import host_netns
from tests.harness.reclaim_fakes import FakeLiveness, fake_settings, reap_settings, scan_result
from tests.harness.results import full_report, reap_result
from tests.harness.snapshots import runtime, snapshot

INTERVAL = 60.0
STALL_AFTER = 600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def agent_settings(mode: str = "reap") -> AgentSettings:
    return AgentSettings(mode=mode, interval=INTERVAL, listen_host="127.0.0.1", listen_port=0, stall_after=STALL_AFTER)


class Passes:
    """Stands in for reap_pass and scan_pass: each call returns the next result given (or
    raises it), and records what it was called with."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.results: list[ReapResult | ScanResult | Exception] = []
        self.calls: list[dict[str, Any]] = []
        self.during: Callable[[], None] = lambda: None
        monkeypatch.setattr(agent_module, "reap_pass", self)
        monkeypatch.setattr(agent_module, "scan_pass", self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append({"args": args, **kwargs})
        self.during()
        result = self.results.pop(0) if len(self.results) > 1 else self.results[0]
        if isinstance(result, Exception):
            raise result
        return result


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> Passes:
    return Passes(monkeypatch)


def make_agent(tmp_path: Path, clock: Clock, mode: str = "reap") -> Agent:
    return Agent(
        fake_settings(tmp_path),
        reap_settings(),
        agent_settings(mode),
        FakeLiveness(runtime()),
        logging.getLogger("t"),
        clock,
    )


def passes_total(agent: Agent, outcome: str) -> float | None:
    return agent.metrics.registry.get_sample_value("cni_reaper_passes_total", {"outcome": outcome})


def test_not_ready_before_the_first_pass(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, Clock())
    assert agent.readiness() == (False, "no pass has finished yet")
    assert agent.health() == (True, "ok")


def test_a_reap_pass_feeds_the_metrics_and_makes_the_agent_ready(tmp_path: Path, passes: Passes) -> None:
    clock = Clock()
    agent = make_agent(tmp_path, clock)
    passes.results = [reap_result()]
    agent.run_pass()
    assert agent.passes == 1 and agent.last_pass_at == clock.now
    assert passes_total(agent, "ok") == 1
    assert agent.metrics.registry.get_sample_value("cni_reaper_skipped_attachments_total") == 1
    assert agent.readiness() == (True, "ok")
    call = passes.calls[0]
    assert call["args"][0] is agent.settings and agent.stop in call["args"], "the pass sees the agent's stop flag"
    assert call["kept"] is agent.kept, "the kept state goes from pass to pass"


def test_readiness_fails_once_the_runtime_has_not_answered_for_a_while(tmp_path: Path, passes: Passes) -> None:
    clock = Clock()
    agent = make_agent(tmp_path, clock)
    undecided = replace(reap_result(), report=full_report(reachable=False))
    passes.results = [reap_result(), undecided]
    agent.run_pass()
    clock.now += READY_INTERVALS * INTERVAL  # right at the limit: still ready
    agent.run_pass()
    assert agent.readiness() == (True, "ok")
    clock.now += 1
    ready, why = agent.readiness()
    assert not ready and "has not answered for" in why
    assert passes_total(agent, "undecided") == 1


def test_an_agent_whose_runtime_never_answered_is_not_ready(tmp_path: Path, passes: Passes) -> None:
    agent = make_agent(tmp_path, Clock())
    passes.results = [replace(reap_result(), report=full_report(reachable=False))]
    agent.run_pass()
    assert agent.readiness() == (False, "the runtime has not answered yet")


def test_a_breaker_pass_still_counts_as_the_runtime_answering(tmp_path: Path, passes: Passes) -> None:
    agent = make_agent(tmp_path, Clock())
    passes.results = [reap_result(breaker_open=True, breaker_reason="too many", reclaimed=(), skipped=())]
    agent.run_pass()
    assert passes_total(agent, "breaker") == 1
    assert agent.readiness() == (True, "ok")


def test_a_pass_that_raises_is_an_error_and_the_agent_goes_on(tmp_path: Path, passes: Passes) -> None:
    agent = make_agent(tmp_path, Clock())
    passes.results = [RuntimeError("boom"), reap_result()]
    agent.run_pass()
    assert passes_total(agent, "error") == 1 and agent.passes == 1
    assert agent.pass_started is None
    assert agent.readiness() == (False, "the runtime has not answered yet")
    agent.run_pass()
    assert passes_total(agent, "ok") == 1 and agent.readiness() == (True, "ok")


def test_a_pass_that_cannot_see_the_hosts_netns_is_one_line_with_no_traceback(
    tmp_path: Path, passes: Passes, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 35: run as a user other than root (or without the host's /proc), each pass logged
    an OSError traceback; the operator's fix is one error line."""
    agent = make_agent(tmp_path, Clock())
    passes.results = [host_unseen()]
    with caplog.at_level(logging.ERROR):
        agent.run_pass()
    assert passes_total(agent, "error") == 1
    (record,) = caplog.records
    assert record.exc_info is None and record.getMessage() == "pass failed"
    assert str(record.__dict__["error"]).endswith("run as root, in the host's PID namespace (hostPID), with its /proc")


def host_unseen() -> HostUnseen:
    """What host_netns raises where it may look at none of its paths."""
    with pytest.raises(HostUnseen) as raised:
        host_netns(("/nonexistent/1/ns/net", "/nonexistent/2/ns/net"))
    assert str(raised.value).startswith("cannot tell the host's network namespace (/nonexistent/1/ns/net: No such")
    return raised.value


def test_a_scan_mode_pass_reclaims_nothing(tmp_path: Path, passes: Passes) -> None:
    agent = make_agent(tmp_path, Clock(), mode="scan")
    passes.results = [scan_result(full_report(), snapshot(), state_saved=False)]
    agent.run_pass()
    assert passes_total(agent, "ok") == 1
    assert "kept" in passes.calls[0]
    registry = agent.metrics.registry
    assert registry.get_sample_value("cni_reaper_attachments", {"verdict": "orphan"}) == 1
    assert registry.get_sample_value("cni_reaper_state_write_errors_total") == 1
    # Scan mode reclaims nothing, so it has no reclaim counters to show.
    assert registry.get_sample_value("cni_reaper_reclaimed_total", {"kind": "ipam", "method": "cni-del"}) is None


def test_an_undecided_scan_mode_pass(tmp_path: Path, passes: Passes) -> None:
    agent = make_agent(tmp_path, Clock(), mode="scan")
    passes.results = [scan_result(full_report(reachable=False), snapshot())]
    agent.run_pass()
    assert passes_total(agent, "undecided") == 1
    assert agent.readiness()[0] is False


def test_a_stopped_agent_starts_no_pass(tmp_path: Path, passes: Passes) -> None:
    agent = make_agent(tmp_path, Clock())
    passes.results = [reap_result()]
    agent.request_stop(signal.SIGTERM, None)
    agent.run_pass()
    assert passes.calls == [] and agent.passes == 0


def test_a_pass_running_past_stall_after_is_unhealthy(tmp_path: Path, passes: Passes) -> None:
    agent = make_agent(tmp_path, Clock())
    seen: list[tuple[bool, str]] = []
    passes.during = lambda: seen.append(agent.health())
    passes.results = [reap_result()]
    agent.run_pass()
    assert seen == [(True, "ok")], "a pass under way is healthy until it stalls"
    agent.pass_started = time.monotonic() - STALL_AFTER - 30  # as if a pass had begun that long ago
    healthy, why = agent.health()
    assert not healthy and "over --stall-after" in why


@pytest.fixture
def restored_signals() -> Iterator[None]:
    """Agent.run installs handlers for SIGTERM and SIGINT; the test process gets its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("restored_signals")
def test_run_schedules_a_pass_at_once_and_stops_cleanly(tmp_path: Path, passes: Passes) -> None:
    agent = make_agent(tmp_path, Clock())
    passes.results = [reap_result()]
    passes.during = agent.stop.set  # the first pass asks the agent to stop
    assert agent.run() == 0
    assert agent.passes == 1 and len(passes.calls) == 1
    assert signal.getsignal(signal.SIGTERM) == agent.request_stop


def test_a_pass_holds_the_lock_and_one_held_by_another_reaper_is_skipped(tmp_path: Path, passes: Passes) -> None:
    """Each pass holds the lock beside the state file for its length and lets it go after; a
    pass whose lock another reaper holds for the whole --lock-wait runs nothing, an error pass,
    and the next pass runs."""
    agent = make_agent(tmp_path, Clock())
    agent.settings = replace(agent.settings, lock_wait=0.0)
    busy: list[str] = []

    def another_reaper_tries() -> None:
        with pytest.raises(LockBusy) as err:
            take_lock(agent.settings.state_file, 0, "reaper reap")
        busy.append(str(err.value))

    passes.during = another_reaper_tries
    passes.results = [reap_result()]
    agent.run_pass()
    assert passes_total(agent, "ok") == 1 and len(busy) == 1 and "reaper" in busy[0]
    with take_lock(agent.settings.state_file, 0, "reaper reap"):  # let go between passes
        agent.run_pass()
    assert len(passes.calls) == 1, "no pass ran while another reaper held the lock"
    assert passes_total(agent, "error") == 1
    passes.during = lambda: None
    agent.run_pass()
    assert len(passes.calls) == 2 and passes_total(agent, "ok") == 2


def test_scan_mode_exports_whether_a_reap_would_trip_the_breaker(tmp_path: Path, passes: Passes) -> None:
    """Scan mode weighs the breaker as reap_pass would, so that a node where reaping would
    reclaim nothing says so before anyone switches it to reap."""
    in_netns = tuple(replace(a, netns=NsKey(1, n)) for n, a in enumerate(full_report().attachments))
    report = replace(full_report(), attachments=in_netns)  # 1 orphan of 3 weighed (pending, excluded aside)
    agent = make_agent(tmp_path, Clock(), mode="scan")
    agent.reap = reap_settings(max_orphan_ratio=0.2)
    passes.results = [scan_result(report, snapshot())]
    agent.run_pass()
    info = agent.metrics.registry.get_sample_value
    assert info("cni_reaper_breaker_open") == 1
    assert info("cni_reaper_build_info", {"version": installed_version(), "mode": "scan"}) == 1
    assert breaker_would_trip(report, reap_settings(max_orphan_ratio=0.5).policy) is False
    assert breaker_would_trip(report, reap_settings(max_orphan_ratio=0.2, force=True).policy) is False
    unreachable = replace(report, runtime=full_report(reachable=False).runtime)
    assert breaker_would_trip(unreachable, reap_settings(max_orphan_ratio=0.0).policy) is False
    agent.reap = reap_settings(max_orphan_ratio=0.5)
    agent.run_pass()
    assert info("cni_reaper_breaker_open") == 0
