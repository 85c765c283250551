"""What a writer of the CNI cache and IPAM dirs (a pod with a hostPath on /var/lib/cni) can make
the reaper do, tried with the real plugins against a real containerd: nothing outside the
roots, no plugin the node does not use, no forged config, and the real leaks still go."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from reaper.options import FindOptions
from reaper.snapshot import take_snapshot
from tests.harness.agent import LabAgent, metric
from tests.harness.configs import cache_doc, conflist
from tests.harness.lab import Lab, Leak
from tests.harness.lab import cni as labcni
from tests.harness.reap_helpers import HANG_PLUGIN, REAP, leak_left, pings
from tests.harness.reaper_cli import run_reaper

CID = "c" * 64
CANARY = "reaper-canary"
# A plugin no config of the node uses: it records every run, and succeeds.
CANARY_SCRIPT = """#!/bin/sh
if [ "$CNI_COMMAND" = "VERSION" ]; then
    printf '%s\\n' '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'
    exit 0
fi
cat > "{marker}.$CNI_CONTAINERID"
exit 0
"""


@pytest.fixture(scope="module")
def markers(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The canary plugin in the lab's bin dir: the dir where it marks each run."""
    made = tmp_path_factory.mktemp("canary")
    lab.install_plugin(CANARY, CANARY_SCRIPT.replace("{marker}", str(made / "ran")))
    return made


def _cached(lab: Lab, container_id: str) -> dict[str, Any]:
    path = lab.cache_dir / "results" / f"{lab.network_name}-{container_id}-eth0"
    doc: dict[str, Any] = json.loads(path.read_bytes())
    return doc


def _write_cached(path: Path, doc: dict[str, Any], config: dict[str, Any]) -> None:
    doc = dict(doc, config=base64.b64encode(json.dumps(config).encode()).decode())
    path.write_text(json.dumps(doc))


def _ran(markers: Path) -> set[str]:
    return {p.name.split(".", 1)[1] for p in markers.glob("ran.*")}


def _filter_rules(lab: Lab) -> str:
    return lab.run_in_netns(["iptables-save", "-t", "filter"], check=True).stdout


def test_symlinks_planted_in_every_root_reach_nothing_outside(lab: Lab, web: str, tmp_path: Path) -> None:
    """results/, a network dir and a pin replaced by links to the host's files (with host PID,
    /proc/1/root/... reaches them from a pod): before, each file there named like a cache entry
    or lease of a dead container was deleted. Now nothing outside the roots changes, the links
    are reported, and the real leak beside them goes."""
    net = lab.network_name
    host = tmp_path / "host-files"
    host.mkdir()
    dead = secrets.token_hex(32)
    victims = {
        host / f"{net}-{dead}-eth0": b"a kubelet client certificate",
        host / "10.123.0.5": f"{dead}\r\neth0".encode(),
        host / "pinned": b"",
    }
    for path, data in victims.items():
        path.write_bytes(data)
    legacy = lab.cache_dir / "cache"
    legacy.mkdir(exist_ok=True)
    (legacy / "results").symlink_to(host)
    (lab.ipam_dir / "evilnet").symlink_to(host)
    pin_link = lab.netns_dir / f"cni-{uuid.uuid4()}"
    pin_link.symlink_to(host / "pinned")
    leak = lab.make_leak(with_cache=True)
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        for path, data in victims.items():
            assert path.read_bytes() == data, f"{path.name} outside the roots was changed"
        assert leak_left(lab, leak) == []
        assert pings(lab, web)
        reported = {c["path"]: c["error"] for c in run.doc["corrupt"]}
        assert "symlink" in reported[str(pin_link)]
        assert any(p.startswith(str(legacy)) for p in reported), reported
    finally:
        (legacy / "results").unlink()
        (lab.ipam_dir / "evilnet").unlink()
        pin_link.unlink(missing_ok=True)


def test_a_forged_entry_runs_no_plugin_and_a_live_pods_firewall_rules_stay(
    lab: Lab, web: str, markers: Path, tmp_path: Path
) -> None:
    """A cache entry for an ID nothing else on the node knows, whose config is the real
    `firewall` plugin and whose prevResult is the live pod's: before, the reaper ran firewall's
    DEL, which deleted the pod's CNI-FORWARD accept rules. Now no plugin runs. The entry's
    chain names the canary, which is not known stateless, so the entry stays, reported as
    waiting for its DEL; the test then removes it, as an operator would."""
    net = lab.network_name
    pod_result = _cached(lab, web)["result"]
    pod_ip = labcni.result_ip(pod_result)
    netns = lab.pod_netns_path(web)
    assert netns is not None
    call = labcni.PluginCall("ADD", web, str(netns), "eth0", (), lab.bin_dir, lab.netns_path)
    labcni.exec_plugin(call, {"type": "firewall", "name": net, "cniVersion": "1.0.0", "prevResult": pod_result})
    assert pod_ip in _filter_rules(lab)
    forged_id = secrets.token_hex(32)
    forged = lab.cache_dir / "results" / f"{net}-{forged_id}-eth0"
    plugins = [{"type": "firewall"}, {"type": CANARY}]
    # No netns: one naming the pod's would make it the pod's (and so live, left alone).
    interfaces = [{k: v for k, v in i.items() if k != "sandbox"} for i in pod_result["interfaces"]]
    forged_result = {**pod_result, "interfaces": interfaces}
    doc = cache_doc(forged_id, net, result=forged_result, cniArgs=[["K8S_POD_NAMESPACE", "x"]])
    _write_cached(forged, doc, {"cniVersion": "1.0.0", "name": net, "plugins": plugins})

    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--allow-plugin", "firewall")
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        assert pod_ip in _filter_rules(lab), "the live pod's firewall rules were deleted"
        assert forged_id not in _ran(markers)
        # All there is of it is the entry its (forged) chain's DEL would need, and no DEL may
        # run: it waits, reported, and takes no place under --max-reap.
        (waiting,) = [s for s in run.doc["skipped"] if s["container_id"] == forged_id]
        assert waiting["reason"].startswith("waits:") and CANARY in waiting["reason"], waiting
        assert forged.exists(), "the entry a stateful chain's DEL needs was removed"
        assert run.doc["reclaimed"] == [], "something else was reclaimed"
        assert pings(lab, web)
    finally:
        # What the operator does once the plugin's own state is freed; the module's next tests
        # start from a node with nothing of this one left.
        forged.unlink(missing_ok=True)


def _recache(lab: Lab, leak: Leak, plugins: list[dict[str, Any]]) -> None:
    assert leak.cache_path is not None
    config = {"cniVersion": "1.0.0", "name": lab.network_name, "plugins": plugins}
    _write_cached(leak.cache_path, _cached(lab, leak.container_id), config)


def test_a_cached_config_runs_only_the_plugins_and_paths_the_node_uses(
    lab: Lab, web: str, markers: Path, tmp_path: Path
) -> None:
    """Real leaks whose cache entries carry a plugin no conf dir config uses, or a path the
    conf dir's config does not hold: DEL runs the node's own config instead, and the leak goes.
    --allow-plugin lets the plugin run (so this test would see it run)."""
    node_plugins = json.loads(lab.network_spec.conflist_bytes("normal"))["plugins"]
    extra_plugin, steered = lab.make_leak(with_cache=True), lab.make_leak(with_cache=True)
    _recache(lab, extra_plugin, [*node_plugins, {"type": CANARY}])
    _recache(lab, steered, [{**node_plugins[0], "binDir": str(lab.cache_dir)}, *node_plugins[1:]])
    plan = run_reaper(lab, "reap", tmp_path / "plan.json", "--json", *REAP, "--dry-run")
    notes = {p["container_id"]: p["config_note"] or "" for p in plan.doc["plan"]}
    assert CANARY in notes[extra_plugin.container_id] and "binDir" in notes[steered.container_id]

    run = run_reaper(lab, "reap", tmp_path / "one.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert leak_left(lab, extra_plugin) == [] and leak_left(lab, steered) == []
    via = {r["kind"]: r["method"] for o in run.doc["reclaimed"] for r in o["resources"]
           if o["container_id"] == extra_plugin.container_id}  # fmt: skip
    assert via["ipam"] == "cni-del", "the node's own config ran DEL"
    assert extra_plugin.container_id not in _ran(markers)
    assert pings(lab, web)
    # --allow-plugin makes the same plugin run.
    allowed = lab.make_leak(with_cache=True)
    _recache(lab, allowed, [*node_plugins, {"type": CANARY}])
    run = run_reaper(lab, "reap", tmp_path / "two.json", "--json", *REAP, "--allow-plugin", CANARY)
    assert run.returncode == 0 and leak_left(lab, allowed) == []
    assert allowed.container_id in _ran(markers), run.stdout[-3000:] + run.stderr[-3000:]


def test_a_prev_result_naming_a_live_pods_address_never_reaches_a_plugin(
    lab: Lab, web: str, markers: Path, tmp_path: Path
) -> None:
    """A real leak whose cache entry's prevResult was rewritten to name the live pod's address
    (what `firewall` deletes by): its DEL runs the node's own config, without that prevResult."""
    net = lab.network_name
    node_plugins = json.loads(lab.network_spec.conflist_bytes("normal"))["plugins"]
    leak = lab.make_leak(with_cache=True)
    assert leak.cache_path is not None
    doc = _cached(lab, leak.container_id)
    doc["result"]["ips"] = _cached(lab, web)["result"]["ips"]
    config = {"cniVersion": "1.0.0", "name": net, "plugins": [*node_plugins, {"type": CANARY}]}
    _write_cached(leak.cache_path, doc, config)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--allow-plugin", CANARY)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert leak.container_id not in _ran(markers)
    assert leak_left(lab, leak) == []
    assert pings(lab, web)


def test_a_data_dir_named_only_by_a_cached_config_is_never_read(tmp_path: Path) -> None:
    """Leases are read, and so may be released, only under --ipam-dir and the dataDirs of the
    conf dir's configs; a cached config can name any dir it likes."""
    outside = tmp_path / "outside" / "net1"
    outside.mkdir(parents=True)
    (outside / "10.0.0.9").write_bytes(f"{CID}\r\neth0".encode())
    cache_dir, conf_dir = tmp_path / "cache", tmp_path / "net.d"
    (cache_dir / "results").mkdir(parents=True)
    conf_dir.mkdir()
    config = json.loads(conflist("net1", dataDir=str(tmp_path / "outside")))
    (cache_dir / "results" / f"net1-{CID}-eth0").write_text(json.dumps(cache_doc(CID, "net1", config=config)))
    options = FindOptions(
        netns_dirs=(),
        ipam_dirs=(str(tmp_path / "ipam"),),
        cache_dir=str(cache_dir),
        conf_dir=str(conf_dir),
        bin_dirs=(),
        netns_patterns=(re.compile("x"),),
    )
    assert take_snapshot(options).of("ipam") == ()
    # The same config in the conf dir is the node's own: its dataDir is read.
    (conf_dir / "10-net1.conflist").write_text(json.dumps(config))
    assert [lease.ip for lease in take_snapshot(options).of("ipam")] == ["10.0.0.9"]


def test_a_root_that_is_a_symlink_is_reported_and_not_used(tmp_path: Path) -> None:
    real = tmp_path / "real-cache"
    (real / "results").mkdir(parents=True)
    (real / "results" / f"net1-{CID}-eth0").write_text(json.dumps(cache_doc(CID, "net1")))
    linked = tmp_path / "cache"
    linked.symlink_to(real)
    options = FindOptions(
        netns_dirs=(),
        ipam_dirs=(),
        cache_dir=str(linked),
        conf_dir=str(tmp_path / "none"),
        bin_dirs=(),
        netns_patterns=(re.compile("x"),),
    )
    snapshot = take_snapshot(options)
    assert snapshot.of("cache") == ()
    assert any(c.path.startswith(str(linked)) and "symlink" in c.error for c in snapshot.corrupt)
    assert os.path.exists(real / "results" / f"net1-{CID}-eth0")


def _plant_hostile_files(lab: Lab, outside: Path) -> list[Path]:
    """What stopped every pass before: a FIFO where a cache entry would be, JSON nested past the
    recursion limit, NUL and non-UTF-8 bytes, a results dir linked outside. The planted paths."""
    net = lab.network_name
    results = lab.cache_dir / "results"
    fifo = results / f"{net}-{secrets.token_hex(32)}-eth0"
    os.mkfifo(fifo)
    nested = results / f"{net}-{secrets.token_hex(32)}-eth0"
    nested.write_bytes(b"[" * 4096)
    binary = results / f"{net}-{secrets.token_hex(32)}-eth0"
    binary.write_bytes(b'{"kind":"cniCacheV1","containerId":"\xff\x00"}')
    lease = lab.ipam_dir / net / "10.123.254.254"
    lease.write_bytes(f"{secrets.token_hex(32)}\r\neth\x000".encode())
    outside.mkdir(exist_ok=True)
    (outside / f"{net}-{secrets.token_hex(32)}-eth0").write_text("a host file")
    legacy = lab.cache_dir / "cache"
    legacy.mkdir(exist_ok=True)
    (legacy / "results").symlink_to(outside)
    return [fifo, nested, binary, lease, legacy / "results"]


def test_the_agent_keeps_reclaiming_beside_hostile_files_and_healthz_tells_a_stall(
    lab: Lab, web: str, tmp_path: Path
) -> None:
    planted = _plant_hostile_files(lab, tmp_path / "outside")
    leak = lab.make_leak(with_cache=True)
    lab.install_plugin("reaper-hang", HANG_PLUGIN)
    flags = (
        "--mode",
        "reap",
        "--interval",
        "2s",
        "--stall-after",
        "4s",
        "--plugin-timeout",
        "10m",
        "--allow-plugin",
        "reaper-hang",
    )
    agent = LabAgent(lab, tmp_path / "state.json", *flags, *REAP, port=9754)
    try:
        deadline = time.monotonic() + 30
        while leak_left(lab, leak) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert leak_left(lab, leak) == [], "the real leak went, beside the hostile files"
        assert agent.wait_for("/healthz", 200) == "ok\n"
        # The pass that freed the leak publishes its figures when it ends.
        body = agent.wait_for_metric("cni_reaper_reclaimed_total", lambda n: n >= 1, kind="netns", method="kernel")
        assert metric(body, "cni_reaper_corrupt_files", kind="cache") >= 3
        assert metric(body, "cni_reaper_corrupt_files", kind="ipam") >= 1
        fifo, _, _, lease, link = planted  # cut cache files named for dead containers may go: they are leaks
        assert stat.S_ISFIFO(fifo.lstat().st_mode) and lease.exists() and link.is_symlink()
        assert [p.read_text() for p in (tmp_path / "outside").iterdir()] == ["a host file"]
        assert pings(lab, web)
        # A pass wedged in a plugin that never returns: /healthz says so, /metrics still answers.
        wedged = lab.make_leak(with_cache=True)
        node_plugins = json.loads(lab.network_spec.conflist_bytes("normal"))["plugins"]
        _recache(lab, wedged, [*node_plugins, {"type": "reaper-hang"}])
        why = agent.wait_for("/healthz", 503, timeout=40)
        assert "over --stall-after 4s" in why
        assert agent.get("/metrics")[0] == 200
    finally:
        assert agent.stop() == 0
        for path in planted:
            path.unlink(missing_ok=True)
    # reaper-hang is not known stateless and its DEL never succeeded: a kernel-only pass keeps
    # what that DEL needs (the entry, the pin, the veth), and the lease and the chain naming the
    # address still configured in that pin (issue 31).
    run = run_reaper(lab, "reap", tmp_path / "after.json", "--json", *REAP, "--method", "kernel")
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr
    (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == wedged.container_id]
    assert outcome["needs_plugin"] == "reaper-hang", outcome
    done = {r["kind"]: (r["method"], r["ok"]) for r in outcome["resources"]}
    assert done == {
        "ipam": ("kernel", False),
        "iptables": ("kernel", False),
        "cache": ("kernel", False),
        "netns": ("kernel", False),
        "veth": ("kernel", False),
    }, outcome
    for r in outcome["resources"]:
        with_pin = r["kind"] in ("ipam", "iptables")
        assert r["error"].startswith("kept: its address stays" if with_pin else "kept: reaper-hang"), r
    # Its chain made stateless again (the node's own plugins): the next pass frees the rest.
    _recache(lab, wedged, node_plugins)
    run = run_reaper(lab, "reap", tmp_path / "last.json", "--json", *REAP, "--method", "kernel")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert leak_left(lab, wedged) == [] and pings(lab, web)
