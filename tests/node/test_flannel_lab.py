"""flannel's per-container files on a real containerd: a leak's file, in the data dir the conf
dir's flannel config names, joins the leak and goes with it; a live pod's stays. And what
flannel's DEL runs from such a file: only what passed the rules of a cached config."""

from __future__ import annotations

import json
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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
from tests.harness.plugin_files import FLANNEL_CONF, flannel_scratch
from tests.harness.reap_helpers import REAP, SCAN, cached_result, leak_left, pings
from tests.harness.reaper_cli import attachments_by_key, kinds, run_reaper


def test_a_leaks_flannel_file_goes_with_it_and_a_live_pods_stays(tmp_path: Path) -> None:
    with Lab() as lab:
        web = lab.run_pod("web")
        leak = lab.make_leak(with_cache=True)
        net = lab.network_name
        data_dir = lab.root / "flannel-data"
        data_dir.mkdir(mode=0o700)
        # After the lab's own list in libcni's order: containerd (max_conf_num 1) keeps using that.
        plugin = {"type": "flannel", "dataDir": str(data_dir)}
        flannel_list = {"cniVersion": "1.0.0", "name": "flannel-lab", "plugins": [plugin]}
        (lab.conf_dir / "99-flannel.conflist").write_text(json.dumps(flannel_list))
        data = flannel_scratch({**FLANNEL_CONF, "name": net})
        leaked = data_dir / leak.container_id
        leaked.write_bytes(data)
        (lab.cache_dir / "flannel").mkdir(mode=0o700)
        kept = lab.cache_dir / "flannel" / web
        kept.write_bytes(data)

        scan = run_reaper(lab, "scan", tmp_path / "scan.json", "--json", *SCAN)
        found = attachments_by_key(scan.doc)
        dead, live = found[(leak.container_id, net, "eth0")], found[(web, net, "eth0")]
        assert dead["verdict"] == "orphan" and "flannel" in kinds(dead)
        assert live["verdict"] == "live" and "flannel" in kinds(live)

        run = run_reaper(lab, "reap", tmp_path / "reap.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        assert all(r["ok"] for o in run.doc["reclaimed"] for r in o["resources"])
        assert leak_left(lab, leak) == [] and not leaked.exists()
        assert kept.read_bytes() == data and pings(lab, web)


# ------------------------------------------------------------- what flannel's DEL runs, checked
#
# Debian ships no flannel binary: tests/harness/flannel_standin.py, installed as the lab's
# `flannel`, does exactly what upstream's DEL does (read `<dataDir>/<CNI_CONTAINERID>`, run the
# plugin its `type` names with the file's bytes on stdin and the same environment, remove the
# file), and logs each run. The plugins it delegates to are Debian's real ones. Each dead
# attachment has kernel evidence (a real pin, a veth whose peer is in it), so what keeps the
# plugin from running is the check of the file, not the want of evidence.

FLANNEL_NET = "flannel-lab"


@dataclass(frozen=True)
class FlannelLab:
    lab: Lab
    web: str  # a live pod on the lab's own network, with the firewall plugin's rules too
    data_dir: Path  # the dataDir of the conf dir's flannel config
    conflist: bytes  # that config
    log: Path  # the stand-in's log of its runs


@pytest.fixture(scope="module")
def flannel_lab(lab: Lab, web: str) -> FlannelLab:
    add_firewall(lab, web)
    data_dir = lab.root / "flannel-data"
    data_dir.mkdir(mode=0o700)
    # flannel hands its `ipam` to the delegate: host-local's leases stay inside the lab.
    plugin = {"type": "flannel", "dataDir": str(data_dir), "ipam": {"dataDir": str(lab.ipam_dir)}}
    conflist = json.dumps({"cniVersion": "1.0.0", "name": FLANNEL_NET, "plugins": [plugin]}).encode()
    # After the lab's own list in libcni's order: containerd (max_conf_num 1) keeps using that.
    (lab.conf_dir / "99-flannel.conflist").write_bytes(conflist)
    return FlannelLab(lab, web, data_dir, conflist, install_standin(lab, "flannel"))


def _dead(fl: FlannelLab, container_id: str, delegate: dict[str, Any]) -> DeadAttachment:
    data = json.dumps(delegate).encode()
    scratch = fl.data_dir / container_id
    return make_dead(
        fl.lab, container_id=container_id, network=FLANNEL_NET, config=fl.conflist, scratch=scratch, data=data
    )


def _reap(fl: FlannelLab, tmp_path: Path, *extra: str) -> dict[str, Any]:
    run = run_reaper(fl.lab, "reap", tmp_path / "state.json", "--json", *REAP, *extra)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.doc


def test_a_forged_flannel_file_naming_firewall_runs_no_plugin(flannel_lab: FlannelLab, tmp_path: Path) -> None:
    """A dead flannel attachment whose per-container file names the real firewall plugin with
    the live pod's result as prevResult. Before, the conf dir's flannel config ran DEL, flannel
    ran firewall's DEL with those bytes, and the live pod's CNI-FORWARD rules were gone. Now no
    plugin runs for it (not even with --allow-plugin firewall): the file is removed as a file,
    the pin and veth by the kernel step."""
    fl = flannel_lab
    lab, web = fl.lab, fl.web
    dead_id = secrets.token_hex(32)
    outside = outside_victims(tmp_path / "outside", dead_id)
    before = live_resources(lab, web)
    assert before["firewall"] and before["netns"] and before["veth"] and before["chain"]
    prev = cached_result(lab, web)
    dead = _dead(fl, dead_id, {"cniVersion": "1.0.0", "name": lab.network_name, "type": "firewall", "prevResult": prev})

    doc = _reap(fl, tmp_path, "--allow-plugin", "firewall")
    assert live_resources(lab, web) == before, "a live pod's resource changed"
    assert pings(lab, web)
    assert standin_runs(fl.log, dead_id) == [], "flannel ran for the forged file"
    notes = {p["container_id"]: p["config_note"] or "" for p in doc["plan"]}
    assert "delegate file not run" in notes[dead_id] and "prevResult" in notes[dead_id], notes
    assert dead_left(lab, dead) == []
    (outcome,) = [o for o in doc["reclaimed"] if o["container_id"] == dead_id]
    assert {r["method"] for r in outcome["resources"]} == {"kernel"}
    assert all(path.read_bytes() == data for path, data in outside.items())


def test_a_forged_host_local_delegate_never_releases_outside_the_cni_dirs(
    flannel_lab: FlannelLab, tmp_path: Path
) -> None:
    """The same attachment whose file names the real host-local plugin with an `ipam.dataDir`
    outside every CNI dir. Before, host-local's DEL removed the files there holding the dead
    container's ID. Now no plugin runs: they are byte-identical and the attachment goes."""
    fl = flannel_lab
    lab, web = fl.lab, fl.web
    dead_id = secrets.token_hex(32)
    outside = outside_victims(tmp_path / "outside", dead_id)
    before = live_resources(lab, web)
    dead = _dead(fl, dead_id, forged_host_local("victim-net", tmp_path / "outside"))

    doc = _reap(fl, tmp_path)
    assert all(path.read_bytes() == data for path, data in outside.items()), "a file outside the CNI dirs changed"
    assert standin_runs(fl.log, dead_id) == []
    assert dead_left(lab, dead) == []
    (outcome,) = [o for o in doc["reclaimed"] if o["container_id"] == dead_id]
    assert {r["method"] for r in outcome["resources"]} == {"kernel"}
    assert live_resources(lab, web) == before and pings(lab, web)


def test_flannel_reads_only_the_checked_copy_of_a_genuine_file(flannel_lab: FlannelLab, tmp_path: Path) -> None:
    """A file as flannel writes it from the node's config (bridge, host-local in the config's
    IPAM dir) passes, and flannel's DEL runs bridge with it. flannel reads a private copy of
    the checked bytes, never the original (a file swapped after the check is never read); the
    original goes as a file, and the private dir with the DEL."""
    fl = flannel_lab
    lab, web = fl.lab, fl.web
    dead_id = secrets.token_hex(32)
    outside = outside_victims(tmp_path / "outside", dead_id)
    before = live_resources(lab, web)
    ipam = {"type": "host-local", "dataDir": str(lab.ipam_dir), "ranges": [[{"subnet": "10.124.0.0/24"}]]}
    dead = _dead(
        fl, dead_id, {"cniVersion": "1.0.0", "name": FLANNEL_NET, "type": "bridge", "bridge": lab.bridge, "ipam": ipam}
    )
    private_before = set(Path(tempfile.gettempdir()).glob("cni-reaper-flannel-*"))

    _reap(fl, tmp_path)
    (run,) = standin_runs(fl.log, dead_id)
    assert run["type"] == "bridge"
    assert run["path"] != str(dead.scratch) and Path(run["path"]).name == dead_id
    assert Path(run["path"]).parent.parent.name.startswith("cni-reaper-flannel-")
    assert set(Path(tempfile.gettempdir()).glob("cni-reaper-flannel-*")) == private_before
    assert dead_left(lab, dead) == []
    assert live_resources(lab, web) == before and pings(lab, web)
    assert all(path.read_bytes() == data for path, data in outside.items())
