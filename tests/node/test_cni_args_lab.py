"""A cache entry's cniArgs against the real plugins (Debian's bridge, host-local, portmap, firewall
in a lab with its own dataDir, on a real containerd): IgnoreUnknown is the reaper's to send, so
host-local's DEL releases the lease whatever the entry spells; an entry whose CNI_ARGS the kernel
would not execute (200 kB) runs no plugin and its files are reclaimed, with no DEL failure.

Before: the entry's own `IgnoreUnknown=false` (or `ignoreunknown=0`) stopped the reaper adding
`IgnoreUnknown=1`, and host-local's DEL failed `ARGS: unknown args` (containernetworking/cni
pkg/types/args.go LoadArgs) on every pass; the 200 kB value failed every plugin with
`Argument list too long`.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lab import Lab
from tests.harness.lab.cni import Leak
from tests.harness.reap_helpers import REAP, leak_left, pings
from tests.harness.reaper_cli import ReaperRun, run_reaper


def _with_args(leak: Leak, args: list[list[str]]) -> None:
    """The leak's cache entry, its cniArgs replaced by `args` (a writer of /var/lib/cni)."""
    assert leak.cache_path is not None
    entry = json.loads(leak.cache_path.read_bytes())
    entry["cniArgs"] = args
    leak.cache_path.write_text(json.dumps(entry))


def _outcome(run: ReaperRun, cid: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [o for o in run.doc["reclaimed"] if o["container_id"] == cid]
    assert len(found) == 1, run.stdout[-3000:] + run.stderr
    return found[0]


@pytest.mark.parametrize("own", [["IgnoreUnknown", "false"], ["ignoreunknown", "0"]])
def test_host_locals_del_releases_the_lease_whatever_ignore_unknown_the_entry_spells(
    lab: Lab, web: str, own: list[str], tmp_path: Path
) -> None:
    leak = lab.make_leak(with_cache=True)
    pod = [["K8S_POD_NAMESPACE", "default"], ["K8S_POD_NAME", f"gone-{leak.container_id[:6]}"]]
    _with_args(leak, [own, *pod])
    run = run_reaper(lab, "reap", tmp_path / f"state-{secrets.token_hex(3)}.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    outcome = _outcome(run, leak.container_id)
    assert outcome["plugin_errors"] == [], outcome
    # host-local itself released it (the DEL ran and succeeded), not the reaper's kernel step.
    via = {r["kind"]: r["method"] for r in outcome["resources"]}
    assert via["ipam"] == "cni-del" and via["veth"] == "cni-del", via
    assert leak_left(lab, leak) == []
    assert pings(lab, web)


def test_an_entry_whose_cni_args_the_kernel_would_not_execute_runs_no_plugin_and_is_reclaimed(
    lab: Lab, web: str, tmp_path: Path
) -> None:
    leak = lab.make_leak(with_cache=True)
    _with_args(leak, [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "x"], ["K8S_POD_UID", "u" * 200_000]])
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    outcome = _outcome(run, leak.container_id)
    assert outcome["plugin_errors"] == [] and outcome["needs_plugin"] is None, outcome
    assert {r["method"] for r in outcome["resources"]} == {"kernel"}
    assert leak_left(lab, leak) == []
    # One line says why no plugin ran.
    refused = [line for line in run.stderr.splitlines() if "more than 16384" in line]
    assert len(refused) == 1 and "no plugin runs: cniArgs make a CNI_ARGS of" in refused[0], run.stderr[-3000:]
    assert pings(lab, web)
