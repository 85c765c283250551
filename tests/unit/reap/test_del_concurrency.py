"""--del-concurrency: how many plugin DELs a reclaiming pass runs at once, a setting bounded
1..32, not a count of the host's CPUs (each DEL is a process beside the reaper, in a container
whose memory limit does not grow with the host)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from reaper.cli import build_parser
from reaper.cni.requests import DelRequest
from reaper.reap import act
from reaper.settings import DEL_CONCURRENCY, SettingsError, reap_settings_from
from tests.harness.passes import bare_reclaimer
from tests.harness.reclaim_fakes import FAKE_LAST, FakeNode, plugin_config, request_for
from tests.harness.snapshots import runtime


def test_the_flag_and_its_variable_set_it_and_the_default_is_fixed() -> None:
    parser = build_parser()
    assert reap_settings_from(parser.parse_args(["reap"]), {}).del_concurrency == DEL_CONCURRENCY
    assert reap_settings_from(parser.parse_args(["reap", "--del-concurrency", "3"]), {}).del_concurrency == 3
    assert reap_settings_from(parser.parse_args(["run"]), {"REAPER_DEL_CONCURRENCY": "32"}).del_concurrency == 32


@pytest.mark.parametrize(
    ("value", "says"),
    [("0", "must be from 1 to 32"), ("33", "must be from 1 to 32"), ("-1", "must be from 1 to 32"),
     ("two", "not a whole number from 1 to 32")],
)  # fmt: skip
def test_a_value_out_of_range_is_one_line_naming_the_flag(value: str, says: str) -> None:
    args = build_parser().parse_args(["reap", "--del-concurrency", value])
    with pytest.raises(SettingsError, match=f"^--del-concurrency='{value}': {says}$"):
        reap_settings_from(args, {})
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    proc = subprocess.run(
        [sys.executable, "-m", "reaper", "reap", "--del-concurrency", value],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr == f"reaper: --del-concurrency='{value}': {says}\n", proc.stderr


@pytest.mark.parametrize("concurrency", [1, 3, 6])
def test_a_pass_runs_exactly_that_many_dels_at_once(
    node: FakeNode, monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    """Each fake DEL waits at a barrier of `concurrency` parties: the pass gets through only if
    that many run together; and the pool they run in has no more workers than that."""
    pools: list[int] = []

    class CountedPool(ThreadPoolExecutor):
        def __init__(self, max_workers: int) -> None:
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(act, "ThreadPoolExecutor", CountedPool)
    monkeypatch.setattr(act, "RECHECK_WINDOW", 600.0)  # no DEL misses its window while others wait
    monkeypatch.setattr(act, "network_status", lambda *_args, **_kwargs: None)
    barrier = threading.Barrier(concurrency, timeout=30)
    lock = threading.Lock()
    inside, most = 0, 0

    def waiting_del(request: DelRequest, *_args: object, **_kwargs: object) -> list[Any]:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            barrier.wait()
        finally:
            with lock:
                inside -= 1
        return []

    monkeypatch.setattr(act, "del_network", waiting_del)
    found = [node.attachment(n, node.add(f"res-{n}"), node.add(f"last-{n}", FAKE_LAST)) for n in range(3 * concurrency)]
    requests: dict[Any, DelRequest | None] = {a.key: request_for(a, plugin_config()) for a in found}
    reclaimer = bare_reclaimer(look=node.look, registry=node.registry, observe=runtime, del_concurrency=concurrency)
    outcomes, skipped = reclaimer.run(found, requests)
    assert skipped == [] and len(outcomes) == len(found) and all(o.ok for o in outcomes), outcomes
    assert most == concurrency and pools == [concurrency]
