"""flannel's per-container files on a real containerd: a leak's file, in the data dir the conf
dir's flannel config names, joins the leak and goes with it; a live pod's stays. And what
flannel's DEL runs from such a file: only what passed the rules of a cached config."""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.plugin_files import FLANNEL_CONF, flannel_scratch
from tests.harness.reap_helpers import (
    REAP,
    SCAN,
    cached_result,
    filter_lines,
    firewall_rules_of,
    host_links,
    leak_left,
    nat_chains,
    pings,
)
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
# file), and logs each run. The plugins it delegates to are Debian's real ones.

FLANNEL_NET = "flannel-lab"
STANDIN = Path(__file__).resolve().parent.parent / "harness" / "flannel_standin.py"


@dataclass(frozen=True)
class FlannelLab:
    lab: Lab
    web: str  # a live pod on the lab's own network, with the firewall plugin's rules too
    data_dir: Path  # the dataDir of the conf dir's flannel config
    conflist: bytes  # that config
    log: Path  # the stand-in's log of its runs


@dataclass(frozen=True)
class DeadAttachment:
    """A flannel attachment of a container no runtime knows, with kernel evidence: a real pin
    and a veth whose peer is in it, its libcni cache entry (the conf dir's flannel config) and
    the per-container file flannel's DEL reads."""

    container_id: str
    pin: Path
    veth: str
    cache: Path
    scratch: Path


@pytest.fixture(scope="module")
def flannel_lab() -> Iterator[FlannelLab]:
    with Lab() as lab:
        web = lab.run_pod("web")
        result = cached_result(lab, web)
        netns = lab.pod_netns_path(web)
        assert netns is not None
        call = labcni.PluginCall("ADD", web, str(netns), "eth0", (), lab.bin_dir, lab.netns_path)
        conf = {"type": "firewall", "name": lab.network_name, "cniVersion": "1.0.0", "prevResult": result}
        labcni.exec_plugin(call, conf)
        data_dir = lab.root / "flannel-data"
        data_dir.mkdir(mode=0o700)
        # flannel hands its `ipam` to the delegate: host-local's leases stay inside the lab.
        plugin = {"type": "flannel", "dataDir": str(data_dir), "ipam": {"dataDir": str(lab.ipam_dir)}}
        conflist = json.dumps({"cniVersion": "1.0.0", "name": FLANNEL_NET, "plugins": [plugin]}).encode()
        # After the lab's own list in libcni's order: containerd (max_conf_num 1) keeps using that.
        (lab.conf_dir / "99-flannel.conflist").write_bytes(conflist)
        standin = lab.bin_dir / "flannel"
        shutil.copyfile(STANDIN, standin)
        standin.chmod(0o755)
        yield FlannelLab(lab, web, data_dir, conflist, Path(f"{standin}.log"))


def _dead(fl: FlannelLab, container_id: str, delegate: dict[str, Any]) -> DeadAttachment:
    lab = fl.lab
    pin = lab.make_pin()
    veth = f"vethd{container_id[:8]}"
    lab.run_in_netns(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(pin)], check=True)
    result = {"cniVersion": "1.0.0", "interfaces": [{"name": veth}, {"name": "eth0", "sandbox": str(pin)}]}
    entry = labcni.cache_entry(
        container_id=container_id,
        network=FLANNEL_NET,
        ifname="eth0",
        conflist=fl.conflist,
        cni_args=(("IgnoreUnknown", "1"),),
        capability_args={},
        result=result,
    )
    cache = labcni.write_cache_entry(lab.cache_dir, {**entry, "netns": str(pin)})
    scratch = fl.data_dir / container_id
    scratch.write_bytes(json.dumps(delegate).encode())
    scratch.chmod(0o600)
    return DeadAttachment(container_id, pin, veth, cache, scratch)


def _dead_left(lab: Lab, dead: DeadAttachment) -> list[str]:
    left = [str(p) for p in (dead.pin, dead.cache, dead.scratch) if p.exists()]
    return left + ([dead.veth] if dead.veth in host_links(lab) else [])


def _live(lab: Lab, pod: str) -> dict[str, object]:
    """Every resource of a live pod: its cache entry and lease (bytes), netns pin, host veth,
    masquerade chain and the firewall plugin's rules."""
    result = cached_result(lab, pod)
    ip = labcni.result_ip(result)
    netns = lab.pod_netns_path(pod)
    return {
        "cache": (lab.cache_dir / "results" / f"{lab.network_name}-{pod}-eth0").read_bytes(),
        "lease": (lab.ipam_dir / lab.network_name / ip).read_bytes(),
        "netns": netns is not None and netns.exists(),
        "veth": labcni.result_host_veth(result, lab.bridge) in host_links(lab),
        "chain": labcni.masq_chain(lab.network_name, pod) in nat_chains(lab),
        "firewall": firewall_rules_of(ip) <= filter_lines(lab),
    }


def _outside(tmp_path: Path, container_id: str) -> dict[Path, bytes]:
    """Files outside every CNI dir that host-local's release would take for this container:
    content its ID, alone or with the ifname, in a dir named like a network."""
    victims = {
        tmp_path / "outside" / "victim-net" / "10.9.9.9": container_id.encode(),
        tmp_path / "outside" / "victim-net" / "10.9.9.8": f"{container_id}\r\neth0".encode(),
    }
    for path, data in victims.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return victims


def _runs(fl: FlannelLab, container_id: str) -> list[dict[str, Any]]:
    if not fl.log.exists():
        return []
    lines = [json.loads(line) for line in fl.log.read_text().splitlines()]
    return [line for line in lines if line["container_id"] == container_id]


def _reap(fl: FlannelLab, tmp_path: Path, *extra: str) -> dict[str, Any]:
    run = run_reaper(fl.lab, "reap", tmp_path / "state.json", "--json", *REAP, *extra)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.doc


def test_a_forged_flannel_file_naming_firewall_runs_no_plugin(flannel_lab: FlannelLab, tmp_path: Path) -> None:
    """A dead flannel attachment (a real pin and veth) whose per-container file names the real
    firewall plugin with the live pod's result as prevResult. Before, the conf dir's flannel
    config ran DEL, flannel ran firewall's DEL with those bytes, and the live pod's CNI-FORWARD
    rules were gone. Now no plugin runs for it (not even with --allow-plugin firewall): the
    file is removed as a file, the pin and veth by the kernel step."""
    fl = flannel_lab
    lab, web = fl.lab, fl.web
    dead_id = secrets.token_hex(32)
    outside = _outside(tmp_path, dead_id)
    before = _live(lab, web)
    assert before["firewall"] and before["netns"] and before["veth"] and before["chain"]
    forged = {
        "cniVersion": "1.0.0",
        "name": lab.network_name,
        "type": "firewall",
        "prevResult": cached_result(lab, web),
    }
    dead = _dead(fl, dead_id, forged)

    doc = _reap(fl, tmp_path, "--allow-plugin", "firewall")
    assert _live(lab, web) == before, "a live pod's resource changed"
    assert pings(lab, web)
    assert _runs(fl, dead_id) == [], "flannel ran for the forged file"
    notes = {p["container_id"]: p["config_note"] or "" for p in doc["plan"]}
    assert "delegate file not run" in notes[dead_id] and "prevResult" in notes[dead_id], notes
    assert _dead_left(lab, dead) == []
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
    outside = _outside(tmp_path, dead_id)
    before = _live(lab, web)
    ipam = {"type": "host-local", "dataDir": str(tmp_path / "outside"), "ranges": [[{"subnet": "10.9.9.0/24"}]]}
    forged = {"cniVersion": "1.0.0", "name": "victim-net", "type": "host-local", "ipam": ipam}
    dead = _dead(fl, dead_id, forged)

    doc = _reap(fl, tmp_path)
    assert all(path.read_bytes() == data for path, data in outside.items()), "a file outside the CNI dirs changed"
    assert _runs(fl, dead_id) == []
    assert _dead_left(lab, dead) == []
    (outcome,) = [o for o in doc["reclaimed"] if o["container_id"] == dead_id]
    assert {r["method"] for r in outcome["resources"]} == {"kernel"}
    assert _live(lab, web) == before and pings(lab, web)


def test_flannel_reads_only_the_checked_copy_of_a_genuine_file(flannel_lab: FlannelLab, tmp_path: Path) -> None:
    """A file as flannel writes it from the node's config (bridge, host-local in the config's
    IPAM dir) passes, and flannel's DEL runs bridge with it. flannel reads a private copy of
    the checked bytes, never the original (a file swapped after the check is never read); the
    original goes as a file, and the private dir with the DEL."""
    fl = flannel_lab
    lab, web = fl.lab, fl.web
    dead_id = secrets.token_hex(32)
    outside = _outside(tmp_path, dead_id)
    before = _live(lab, web)
    ipam = {"type": "host-local", "dataDir": str(lab.ipam_dir), "ranges": [[{"subnet": "10.124.0.0/24"}]]}
    genuine = {"cniVersion": "1.0.0", "name": FLANNEL_NET, "type": "bridge", "bridge": lab.bridge, "ipam": ipam}
    dead = _dead(fl, dead_id, genuine)
    private_before = set(Path(tempfile.gettempdir()).glob("cni-reaper-flannel-*"))

    _reap(fl, tmp_path)
    (run,) = _runs(fl, dead_id)
    assert run["type"] == "bridge"
    assert run["path"] != str(dead.scratch) and Path(run["path"]).name == dead_id
    assert Path(run["path"]).parent.parent.name.startswith("cni-reaper-flannel-")
    assert set(Path(tempfile.gettempdir()).glob("cni-reaper-flannel-*")) == private_before
    assert _dead_left(lab, dead) == []
    assert _live(lab, web) == before and pings(lab, web)
    assert all(path.read_bytes() == data for path, data in outside.items())
