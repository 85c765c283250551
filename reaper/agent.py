"""`reaper run`: a pass every interval, metrics and health over HTTP, a clean stop on SIGTERM."""

from __future__ import annotations

import datetime
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from reaper.events import EventPoster
from reaper.host.memo import InventoryMemo
from reaper.host.passlock import LockBusy, LockUnusable, pass_lock
from reaper.http import HealthServer
from reaper.kinds.registry import REGISTRY, Registry
from reaper.metrics import ReaperMetrics
from reaper.model import VERDICTS, HostUnseen, PassOutcome, ReapResult, ScanResult
from reaper.reap import reap_pass
from reaper.reap.plan import breaker_would_trip
from reaper.runtime.liveness import LivenessSource
from reaper.scan import scan_pass
from reaper.settings import AgentSettings, ReapSettings, Settings
from reaper.state import KeptState

READY_INTERVALS = 3  # /readyz fails when the runtime has not answered for this many intervals
STOP_POLL = 0.5  # seconds between looks at the stop flag
JITTER = 0.1  # share of the interval each pass may start early or late


class Agent:
    def __init__(
        self,
        settings: Settings,
        reap: ReapSettings,
        agent: AgentSettings,
        liveness: LivenessSource,
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
        events: EventPoster | None = None,
        registry: Registry = REGISTRY,
    ) -> None:
        self.settings = settings
        self.reap = reap
        self.agent = agent
        self.liveness = liveness
        self.log = log
        self.clock = clock
        self.events = events  # None: no Events (off, or no API to post them to)
        self.registry = registry  # the kinds every pass looks for and reclaims
        self.metrics = ReaperMetrics(mode="reap" if agent.mode == "reap" else "scan")
        self.memo = InventoryMemo()
        self.kept = KeptState()  # the state file read once; then counted from what this process saved
        self.stop = threading.Event()
        self.passes = 0
        self.last_pass_at: float | None = None
        self.last_runtime_up_at: float | None = None
        self.started_at = clock()
        self.pass_started: float | None = None  # monotonic, while a pass runs

    def run_pass(self) -> None:
        if self.stop.is_set():
            return
        started = self.pass_started = time.monotonic()
        outcome: PassOutcome
        try:
            outcome, fields = self._locked_pass()
        except HostUnseen as err:  # the operator's to fix (reaper.snapshot.host_netns): one line
            self.log.error("pass failed", extra={"error": str(err)})
            outcome, fields = "error", {}
        except Exception as err:  # a pass must never kill the agent; the next one tries again
            self.log.exception("pass failed", extra={"error": str(err)})
            outcome, fields = "error", {}
        finally:
            self.pass_started = None
        seconds = time.monotonic() - started
        now = self.clock()
        self.metrics.observe_pass(seconds, outcome, now)
        self.passes += 1
        self.last_pass_at = now
        if outcome in ("ok", "breaker"):
            self.last_runtime_up_at = now
        self.log.info(
            "pass", extra={"mode": self.agent.mode, "outcome": outcome, "seconds": round(seconds, 3), **fields}
        )

    def _locked_pass(self) -> tuple[PassOutcome, dict[str, object]]:
        """One pass under the lock beside the state file, let go at its end so that an operator's
        one-shot runs between passes; held by another reaper past --lock-wait, the pass is skipped."""
        try:
            lock = pass_lock(
                self.settings.state_file,
                self.settings.lock_wait,
                self.log,
                changes_node=self.agent.mode == "reap",
                pause=self.stop.wait,
            )
        except (LockBusy, LockUnusable) as err:
            return "error", {"error": str(err)}
        with lock:
            return self._pass()

    def _pass(self) -> tuple[PassOutcome, dict[str, object]]:
        result: ScanResult | ReapResult
        if self.agent.mode == "scan":
            result = scan_pass(
                self.settings, self.liveness, self.log, self.clock, self.memo, kept=self.kept,
                allow_plugins=self.reap.allow_plugins, plugins_run=not self.reap.policy.kernel_only,
                registry=self.registry,
            )  # fmt: skip
            self.metrics.observe_scan(result.report)
            self.metrics.observe_state(result.state_saved)
            self.metrics.observe_breaker(breaker_would_trip(result.report, self.reap.policy))
        else:
            result = reap_pass(
                self.settings, self.reap, self.liveness, self.log, self.clock, self.memo, self.stop, kept=self.kept,
                registry=self.registry,
            )  # fmt: skip
            self.metrics.observe_reap(result)
        fields: dict[str, object] = {v: result.report.count(v) for v in VERDICTS}
        if result.problem is not None:
            fields["error"] = result.problem
        if isinstance(result, ReapResult):
            fields["reclaimed"] = sum(1 for o in result.reclaimed if o.ok)
            fields["incomplete"] = sum(1 for o in result.reclaimed if not o.ok)
            fields["skipped"] = len(result.skipped)
        if self.events is not None:  # the poster sends them in its own thread: never waits, never raises
            self.events.submit(result)
        return result.outcome, fields

    def readiness(self) -> tuple[bool, str]:
        if self.last_pass_at is None:
            return False, "no pass has finished yet"
        if self.last_runtime_up_at is None:
            return False, "the runtime has not answered yet"
        age = self.clock() - self.last_runtime_up_at
        if age > READY_INTERVALS * self.agent.interval:
            return False, f"the runtime has not answered for {age:.0f}s"
        return True, "ok"

    def health(self) -> tuple[bool, str]:
        """Unhealthy while a pass has run past --stall-after: wedged, the kubelet restarts it."""
        started = self.pass_started
        if started is not None:
            running = time.monotonic() - started
            if running > self.agent.stall_after:
                return False, f"a pass has run for {running:.0f}s, over --stall-after {self.agent.stall_after:g}s"
        return True, "ok"

    def request_stop(self, signum: int, _frame: FrameType | None) -> None:
        self.log.info("stopping: the current step finishes, no new one starts", extra={"signal": signum})
        self.stop.set()

    def run(self) -> int:
        server = HealthServer(
            self.agent.listen_host, self.agent.listen_port, self.metrics.exposition, self.readiness, self.health
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        scheduler = BackgroundScheduler(timezone=datetime.UTC)
        scheduler.add_job(
            self.run_pass,
            IntervalTrigger(seconds=self.agent.interval, jitter=max(1, int(self.agent.interval * JITTER))),
            id="pass",
            max_instances=1,  # never two passes at once
            coalesce=True,  # missed runs collapse into one
            misfire_grace_time=None,
            next_run_time=datetime.datetime.now(datetime.UTC),
        )
        scheduler.start()
        self.log.info(
            "agent started",
            extra={
                "mode": self.agent.mode,
                "interval": self.agent.interval,
                "listen": f"{self.agent.listen_host}:{self.agent.listen_port}",
            },
        )
        while not self.stop.wait(STOP_POLL):
            pass
        scheduler.shutdown(wait=True)  # the running pass sees the stop and ends its current step
        server.close()
        if self.events is not None:
            self.events.close()
        self.log.info("agent stopped", extra={"passes": self.passes})
        return 0
