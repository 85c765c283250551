"""`reaper run`: a pass every interval, metrics and health over HTTP, a clean stop on SIGTERM."""

from __future__ import annotations

import datetime
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import CONTENT_TYPE_LATEST

from reaper.inventory.memo import InventoryMemo
from reaper.liveness import LivenessSource
from reaper.metrics import ReaperMetrics
from reaper.reap import reap_pass
from reaper.scan import scan_pass
from reaper.settings import AgentSettings, ReapSettings, Settings

READY_INTERVALS = 3  # /readyz fails when the runtime has not answered for this many intervals


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class Agent:
    def __init__(
        self,
        settings: Settings,
        reap: ReapSettings,
        agent: AgentSettings,
        liveness: LivenessSource,
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.reap = reap
        self.agent = agent
        self.liveness = liveness
        self.log = log
        self.clock = clock
        self.metrics = ReaperMetrics()
        self.memo = InventoryMemo()
        self.stop = threading.Event()
        self.passes = 0
        self.last_pass_at: float | None = None
        self.last_runtime_up_at: float | None = None
        self.started_at = clock()

    # ------------------------------------------------------------------ one pass

    def run_pass(self) -> None:
        if self.stop.is_set():
            return
        started = time.monotonic()
        try:
            outcome, fields = self._pass()
        except Exception as err:  # a pass must never kill the agent; the next one tries again
            self.log.exception("pass failed", extra={"error": str(err)})
            outcome, fields = "error", {}
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

    def _pass(self) -> tuple[str, dict[str, object]]:
        if self.agent.mode == "scan":
            result = scan_pass(self.settings, self.liveness, self.log, self.clock, self.memo)
            self.metrics.observe_scan(result.report)
            self.metrics.observe_state(result.state_saved)
            report = result.report
            outcome = "ok" if report.runtime.reachable else "undecided"
            fields: dict[str, object] = {v: report.count(v) for v in ("live", "orphan", "pending", "unknown")}
            if not report.runtime.reachable:
                fields["error"] = f"runtime unreachable: {report.runtime.error}"
            return outcome, fields
        reaped = reap_pass(self.settings, self.reap, self.liveness, self.log, self.clock, self.memo, self.stop)
        self.metrics.observe_reap(reaped)
        report = reaped.report
        if not report.runtime.reachable or reaped.recheck_error is not None:
            outcome = "undecided"
        elif reaped.breaker_open:
            outcome = "breaker"
        else:
            outcome = "ok"
        fields = {v: report.count(v) for v in ("live", "orphan", "pending", "unknown")}
        if not report.runtime.reachable:
            fields["error"] = f"runtime unreachable: {report.runtime.error}"
        elif reaped.recheck_error is not None:
            fields["error"] = f"runtime unreachable at the re-check: {reaped.recheck_error}"
        elif reaped.breaker_open:
            fields["error"] = reaped.breaker_reason
        fields["reclaimed"] = sum(1 for o in reaped.reclaimed if o.ok)
        fields["incomplete"] = sum(1 for o in reaped.reclaimed if not o.ok)
        fields["skipped"] = len(reaped.skipped)
        return outcome, fields

    # ------------------------------------------------------------------ health

    def readiness(self) -> tuple[bool, str]:
        if self.last_pass_at is None:
            return False, "no pass has finished yet"
        if self.last_runtime_up_at is None:
            return False, "the runtime has not answered yet"
        age = self.clock() - self.last_runtime_up_at
        if age > READY_INTERVALS * self.agent.interval:
            return False, f"the runtime has not answered for {age:.0f}s"
        return True, "ok"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "cni-reaper"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(HTTPStatus.OK, agent.metrics.exposition(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._send(HTTPStatus.OK, b"ok\n", "text/plain")
                elif path == "/readyz":
                    ok, why = agent.readiness()
                    status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
                    self._send(status, f"{why}\n".encode(), "text/plain")
                else:
                    self._send(HTTPStatus.NOT_FOUND, b"not found: try /metrics, /healthz, /readyz\n", "text/plain")

            def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # scrapes every 15s are not news

        return Handler

    # ------------------------------------------------------------------ lifecycle

    def request_stop(self, signum: int, _frame: FrameType | None) -> None:
        self.log.info("stopping: the current step finishes, no new one starts", extra={"signal": signum})
        self.stop.set()

    def run(self) -> int:
        server_class = _IPv6Server if ":" in self.agent.listen_host else ThreadingHTTPServer
        server = server_class((self.agent.listen_host, self.agent.listen_port), self._handler())
        server.daemon_threads = True
        http_thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        http_thread.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        scheduler = BackgroundScheduler(timezone=datetime.UTC)
        scheduler.add_job(
            self.run_pass,
            IntervalTrigger(seconds=self.agent.interval, jitter=max(1, int(self.agent.interval * 0.1))),
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
        while not self.stop.wait(0.5):
            pass
        scheduler.shutdown(wait=True)  # the running pass sees the stop and ends its current step
        server.shutdown()
        server.server_close()
        self.log.info("agent stopped", extra={"passes": self.passes})
        return 0
