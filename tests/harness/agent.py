"""`reaper run` driven from a test: started in the lab's netns, probed over HTTP, stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.harness.lab import Lab
from tests.harness.probe import probe_argv
from tests.harness.probes import http_get as http_get_probe
from tests.harness.reaper_cli import lab_flags


def http_get(lab: Lab, url: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET `url` from inside the lab's netns: the status and the body (0 and why, unanswered)."""
    out = lab.run_in_netns(probe_argv(http_get_probe, url, str(timeout)), check=True, timeout=timeout + 30).stdout
    status, _, body = out.partition("\n")
    return int(status), body


class LabAgent:
    """`reaper run` inside the lab netns, listening on the lab's own loopback."""

    def __init__(self, lab: Lab, state: Path, *extra: str, port: int = 9753) -> None:
        self.lab, self.port = lab, port
        argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", "run"]
        argv += [*lab_flags(lab, state), "--listen", f"127.0.0.1:{port}", "--log-format", "json", *extra]
        self.log_path = state.with_suffix(".log")
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.lab, f"http://127.0.0.1:{self.port}{path}")

    def wait_for(self, path: str, want: int, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        last: tuple[int, str] = (0, "")
        while time.monotonic() < deadline:
            last = self.get(path)  # (0, why) while it is not listening yet
            if last[0] == want:
                return last[1]
            time.sleep(0.2)
        raise AssertionError(f"{path} never answered {want}; last {last}")

    def wait_for_metric(self, name: str, holds: Callable[[float], bool], timeout: float = 30.0, **labels: str) -> str:
        """The /metrics body once the series `name{labels}` is there and its value `holds`:
        a pass publishes its figures when it ends, after the node changed under it."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            status, body = self.get("/metrics")
            try:
                value = metric(body, name, **labels)
            except AssertionError as absent:
                last = str(absent)
            else:
                if status == 200 and holds(value):
                    return body
                last = f"{name} is {value}"
            time.sleep(0.2)
        raise AssertionError(f"/metrics never had the figure wanted: {last}")

    def log_lines(self) -> list[dict[str, object]]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
        return code


def metric(body: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in body.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric_name, _, rest = series.partition("{")
        got = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
        if metric_name == name and got == want:
            return float(value)
    raise AssertionError(f"no {name}{{{want}}} in metrics")
