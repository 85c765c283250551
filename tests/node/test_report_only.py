"""Report-only by default, as an operator meets it on the command line: `reaper scan` run by hand
twice in a row counts one confirmation, not two; and in a process whose REAPER_MODE is scan (a
report-only pod, `kubectl exec ... reaper reap`), a reap is refused unless --force.

Each probe runs the real `reaper` command in a network namespace and mount namespace of its own
(nothing of the host's links or firewall is seen or touched), beside a CRI runtime made to order
that lists no sandbox, with one old host-local lease of a container it does not list."""

from __future__ import annotations

from pathlib import Path

from tests.harness.probe import run_probe
from tests.harness.probes import report_only


def test_two_scans_by_hand_seconds_apart_count_one_confirmation(tmp_path: Path) -> None:
    out = run_probe(report_only, str(tmp_path), "twice")
    assert out["first"]["verdicts"] == ["pending"], out["first"]
    # On the second run the leak is still pending: it came seconds after the first, under the
    # 30s spacing half the default --interval sets; the state file still says one pass.
    assert (out["second"]["status"], out["second"]["verdicts"]) == (0, ["pending"]), out["second"]
    assert out["count"] == 1


def test_a_reap_where_the_mode_is_scan_is_refused_unless_forced(tmp_path: Path) -> None:
    out = run_probe(report_only, str(tmp_path), "mode")
    refused = out["refused"]
    assert refused["status"] == 2 and refused["verdicts"] == []
    lines = refused["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("reaper: REAPER_MODE is scan here"), refused["stderr"]
    assert "--force" in lines[0] and "Traceback" not in refused["stderr"]
    assert out["lease_after_refusal"], "nothing was reclaimed"
    assert out["dry_run"]["status"] == 1 and out["dry_run"]["verdicts"] == ["orphan"], "a plan changes nothing"
    # --force, the operator's say-so, reclaims (the breaker too is overridden by it).
    assert out["forced"]["status"] == 0, out["forced"]
    assert not out["lease_after_force"]
