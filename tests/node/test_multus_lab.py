"""What multus' thin plugin runs from its per-container file, on a real containerd with the
real Debian plugins: only delegates that passed the rules of a cached config, with cached
results that name nothing a live pod holds.

Debian ships no multus binary: tests/harness/multus_standin.py, installed as the lab's
`multus`, does what upstream's DEL does with saved delegates (read `<cniDir>/<CNI_CONTAINERID>`,
DEL each delegate's config through libcni's steps with `<cniDir>/results/...` as its
prevResult, remove the file), and logs each run. Each dead attachment has kernel evidence (a
real pin, a veth whose peer is in it), so what keeps the plugins from running is the check of
the files, not the want of evidence.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.configs import cache_doc
from tests.harness.delegate_lab import (
    DeadAttachment,
    add_firewall,
    dead_left,
    forged_host_local,
    install_standin,
    live_resources,
    make_dead,
    outside_victims,
    standin_runs,
)
from tests.harness.lab import Lab
from tests.harness.plugin_files import multus_delegate, multus_scratch
from tests.harness.reap_helpers import REAP, cached_result, pings
from tests.harness.reaper_cli import run_reaper

MULTUS_NET = "multus-cni-network"


@dataclass(frozen=True)
class MultusLab:
    lab: Lab
    web: str  # a live pod on the lab's own network, with the firewall plugin's rules too
    cni_dir: Path  # the cniDir of the conf dir's multus config
    config: bytes  # that config
    log: Path  # the stand-in's log of its runs


@pytest.fixture(scope="module")
def multus_lab(lab: Lab, web: str) -> MultusLab:
    add_firewall(lab, web)
    cni_dir = lab.root / "multus-data"
    cni_dir.mkdir(mode=0o700)
    conf = {"cniVersion": "0.3.1", "name": MULTUS_NET, "type": "multus", "cniDir": str(cni_dir)}
    config = json.dumps({**conf, "binDir": str(lab.bin_dir)}).encode()
    # After the lab's own list in libcni's order: containerd (max_conf_num 1) keeps using that.
    (lab.conf_dir / "99-multus.conf").write_bytes(config)
    return MultusLab(lab, web, cni_dir, config, install_standin(lab, "multus"))


def _dead(ml: MultusLab, container_id: str, delegates: list[bytes]) -> DeadAttachment:
    """Its multus file lists `delegates` (configs), the first the cluster network (eth0), the
    others secondary networks (net1, ...), as multus names their interfaces."""
    scratch = ml.cni_dir / container_id
    data = multus_scratch([multus_delegate(d) for d in delegates])
    return make_dead(
        ml.lab, container_id=container_id, network=MULTUS_NET, config=ml.config, scratch=scratch, data=data
    )


def _reap(ml: MultusLab, tmp_path: Path, *extra: str) -> dict[str, Any]:
    """A pass that leaves what a multus DEL still needs: it exits 1 (not everything freed)."""
    run = run_reaper(ml.lab, "reap", tmp_path / "state.json", "--json", *REAP, *extra)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    return run.doc


def _outcome(doc: dict[str, Any], container_id: str, network: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        o for o in doc["reclaimed"] if (o["container_id"], o["network"]) == (container_id, network)
    ]
    assert len(found) == 1, doc["reclaimed"]
    return found[0]


def _kept_for_multus(doc: dict[str, Any], dead: DeadAttachment) -> None:
    """multus is not known stateless (its delegates may keep state only their DEL frees, and
    that DEL reads the multus file): with its DEL refused, the dead attachment's cache entry,
    multus file, pin and veth all stay, reported as needing multus' DEL."""
    outcome = _outcome(doc, dead.container_id, MULTUS_NET)
    assert outcome["needs_plugin"] == "multus" and outcome["plugin_errors"] == [], outcome
    assert {(r["kind"], r["method"], r["ok"]) for r in outcome["resources"]} == {
        ("cache", "kernel", False),
        ("multus", "kernel", False),
        ("netns", "kernel", False),
        ("veth", "kernel", False),
    }
    assert all(r["error"].startswith("kept: multus may keep state only its DEL frees") for r in outcome["resources"])


def _clear(ml: MultusLab, tmp_path: Path, dead: DeadAttachment, *kept: Path) -> None:
    """What the operator does once the delegates' own state is freed: remove the kept files.
    The pin and veth then go by a kernel-only pass, with no plugin run, and the module's next
    test starts from a node with nothing of this one left."""
    for path in (dead.cache, dead.scratch, *kept):
        path.unlink()
    run = run_reaper(ml.lab, "reap", tmp_path / "clear.json", "--json", *REAP, "--method", "kernel")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert dead_left(ml.lab, dead) == []
    assert standin_runs(ml.log, dead.container_id) == []


def test_a_forged_multus_delegate_with_a_live_pods_cached_result_runs_no_plugin(
    multus_lab: MultusLab, tmp_path: Path
) -> None:
    """A dead multus attachment whose file lists the lab's own network and a secondary
    network, the real firewall plugin, with a cached result beside it (where libcni finds that
    delegate's prevResult) naming the live pod's address. Before, multus' DEL ran firewall with
    it and the live pod's CNI-FORWARD rules were gone. Now no plugin runs (not even with
    --allow-plugin firewall): the attachment stays for multus' DEL, and so does the cached
    result (its chain is in no config, so it is not known stateless)."""
    ml = multus_lab
    lab, web = ml.lab, ml.web
    dead_id = secrets.token_hex(32)
    outside = outside_victims(tmp_path / "outside", dead_id)
    before = live_resources(lab, web)
    assert before["firewall"]
    firewall = json.dumps({"cniVersion": "1.0.0", "name": "fw-net", "type": "firewall"}).encode()
    dead = _dead(ml, dead_id, [lab.network_spec.conflist_bytes("normal"), firewall])
    result = ml.cni_dir / "results" / f"fw-net-{dead_id}-net1"
    result.parent.mkdir(mode=0o700, exist_ok=True)
    # No netns in it: one naming the pod's would make the entry the pod's (and so live).
    live = cached_result(lab, web)
    live["interfaces"] = [{k: v for k, v in i.items() if k != "sandbox"} for i in live["interfaces"]]
    result.write_text(json.dumps(cache_doc(dead_id, "fw-net", "net1", result=live)))

    doc = _reap(ml, tmp_path, "--allow-plugin", "firewall")
    assert live_resources(lab, web) == before, "a live pod's resource changed"
    assert pings(lab, web)
    assert standin_runs(ml.log, dead_id) == [], "multus ran for the forged file"
    notes = {(p["container_id"], p["network"]): p["config_note"] or "" for p in doc["plan"]}
    note = notes[(dead_id, MULTUS_NET)]
    assert "delegate file not run" in note and "prevResult" in note, notes
    _kept_for_multus(doc, dead)
    # The delegate's cached result is all there is of its attachment, and no config tells its
    # chain: it waits for a DEL, reported, and takes no place under --max-reap.
    (cached,) = [s for s in doc["skipped"] if (s["container_id"], s["network"]) == (dead_id, "fw-net")]
    assert cached["reason"].startswith("waits:") and "a chain no config names" in cached["reason"], cached
    assert result.exists() and len(dead_left(lab, dead)) == 4
    assert all(path.read_bytes() == data for path, data in outside.items())
    _clear(ml, tmp_path, dead, result)
    assert live_resources(lab, web) == before and pings(lab, web)


def test_a_forged_multus_host_local_delegate_never_releases_outside_the_cni_dirs(
    multus_lab: MultusLab, tmp_path: Path
) -> None:
    """A delegate naming the real host-local plugin with an `ipam.dataDir` outside every CNI
    dir. Before, its DEL removed the files there holding the dead ID. Now no plugin runs: they
    are byte-identical, and the attachment stays for multus' DEL."""
    ml = multus_lab
    lab, web = ml.lab, ml.web
    dead_id = secrets.token_hex(32)
    outside = outside_victims(tmp_path / "outside", dead_id)
    before = live_resources(lab, web)
    dead = _dead(ml, dead_id, [json.dumps(forged_host_local("victim-net", tmp_path / "outside")).encode()])

    doc = _reap(ml, tmp_path)
    assert all(path.read_bytes() == data for path, data in outside.items()), "a file outside the CNI dirs changed"
    assert standin_runs(ml.log, dead_id) == []
    notes = {(p["container_id"], p["network"]): p["config_note"] or "" for p in doc["plan"]}
    assert "delegate file not run" in notes[(dead_id, MULTUS_NET)], notes
    _kept_for_multus(doc, dead)
    assert [o["container_id"] for o in doc["reclaimed"]] == [dead_id], "something else was reclaimed"
    assert live_resources(lab, web) == before and pings(lab, web)
    _clear(ml, tmp_path, dead)
    assert all(path.read_bytes() == data for path, data in outside.items())
    assert live_resources(lab, web) == before and pings(lab, web)
