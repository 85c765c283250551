"""`reaper reap` on a real containerd whose state was lost: every orphan goes, nothing live is touched.

Each test ends by checking that every live pod still has its netns, veth, lease, cache entries
and chains exactly as before, and still answers ping from the lab netns.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reaper.kinds.iptables import chain_name
from tests.harness.configs import cache_doc
from tests.harness.lab import Lab, PortMap, kernel
from tests.harness.lab import cni as labcni
from tests.harness.plugins import gc_recorder, script
from tests.harness.probe import probe_argv
from tests.harness.probes import bind_holder
from tests.harness.reap_helpers import (
    HANG_PLUGIN,
    REAP,
    SCAN,
    host_links,
    hostport_chains,
    leak_left,
    pings,
    racing_reap,
    reproduce_both_seeds,
    rewrite_cached_config,
)
from tests.harness.reaper_cli import ReaperRun, attachments_by_key, run_reaper

Key = tuple[str | None, str | None, str | None]


@dataclass
class Forgotten:
    lab: Lab
    web: str
    db: str
    seeds: dict[str, str]  # pin name -> what left it, of sandboxes the runtime forgot
    live: dict[Key, list[tuple[str, str]]]  # the live attachments and their resources


def _resources(attachment: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((r["kind"], r["name"]) for r in attachment["resources"])


def live_attachments(lab: Lab, tmp: Path) -> dict[Key, list[tuple[str, str]]]:
    run = run_reaper(lab, "scan", tmp / f"live-{secrets.token_hex(4)}.json", "--json", *SCAN)
    return {k: _resources(a) for k, a in attachments_by_key(run.doc).items() if a["verdict"] == "live"}


def assert_live_intact(world: Forgotten, tmp: Path) -> None:
    now = live_attachments(world.lab, tmp)
    for key, resources in world.live.items():
        assert now.get(key) == resources, f"live attachment {key} changed"
    for pod in (world.web, world.db):
        ping = world.lab.run_in_netns(["ping", "-c", "1", "-W", "2", world.lab.pod_ip(pod)])
        assert ping.returncode == 0, f"live pod {pod[:12]} no longer answers: {ping.stdout}"


def reclaimed(run: ReaperRun, cid: str | None) -> dict[str, Any]:
    found: list[dict[str, Any]] = [r for r in run.doc["reclaimed"] if r["container_id"] == cid]
    assert len(found) == 1, run.doc["reclaimed"]
    return found[0]


@pytest.fixture(scope="module")
def forgotten(new_lab: Callable[[], Lab], tmp_path_factory: pytest.TempPathFactory) -> Forgotten:
    """A lab of its own whose runtime lost its state after both seed reports and a pod with a
    hostPort; then two live pods started afresh."""
    lab = new_lab()
    chained, nocni = reproduce_both_seeds(lab)
    old = lab.run_pod("old", port_mappings=[PortMap(8081, 81)])
    seeds = {}
    for what, sandbox in (("chained", chained), ("nocni", nocni), ("old", old)):
        pin = lab.pod_netns_path(sandbox)
        assert pin is not None
        seeds[pin.name] = what
    lab.forget_runtime_state()
    web = lab.run_pod("web", port_mappings=[PortMap(8080, 80)])
    db = lab.run_pod("db")
    world = Forgotten(lab, web, db, seeds, {})
    world.live = live_attachments(lab, tmp_path_factory.mktemp("live"))
    assert len(world.live) == 4  # two pods, each eth0 and cni-loopback
    return world


def test_everything_the_runtime_forgot_is_reclaimed(forgotten: Forgotten, tmp_path: Path) -> None:
    lab, net = forgotten.lab, forgotten.lab.network_name
    cached = lab.make_leak(with_cache=True, port_mappings=[PortMap(9090, 90)])
    bare = lab.make_leak(with_cache=False)
    # A legacy one-line lease and a pile of corrupt cache files of dead containers.
    legacy_cid = secrets.token_hex(32)
    legacy = lab.ipam_dir / net / "10.123.250.200"
    legacy.write_text(legacy_cid)
    results = lab.cache_dir / "results"
    corrupt = {results / f"{net}-{secrets.token_hex(32)}-eth0": data for data in (b"", b"", b'{"kind": "cniC', b"\0\0")}
    for path, data in corrupt.items():
        path.write_bytes(data)
    untied = results / "garbage"
    untied.write_bytes(b"")
    assert hostport_chains(lab) == 3  # web, the old pod and the cached leak
    pins_before = {p.name for p in lab.netns_dir.iterdir()}
    assert set(forgotten.seeds) <= pins_before

    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert all(r["ok"] for o in run.doc["reclaimed"] for r in o["resources"])

    assert leak_left(lab, cached) == [] and leak_left(lab, bare) == [], run.doc["skipped"]
    assert not legacy.exists()
    assert not any(p.exists() for p in corrupt)
    assert untied.exists(), "a file no attachment names is reported, never deleted"
    pins_after = {p.name for p in lab.netns_dir.iterdir()}
    assert not set(forgotten.seeds) & pins_after, "the forgotten sandboxes' pins are gone"
    assert hostport_chains(lab) == 1  # only the live web pod's
    # The cached leak went through its plugins' DEL (cached config, capability args, prevResult).
    via = {r["kind"]: r["method"] for r in reclaimed(run, cached.container_id)["resources"]}
    assert via["ipam"] == "cni-del" and via["veth"] == "cni-del" and via["iptables"] == "cni-del"
    after = run_reaper(lab, "scan", tmp_path / "state2.json", "--json", *SCAN)
    assert after.returncode == 0 and after.doc["summary"]["orphan"] == 0
    assert_live_intact(forgotten, tmp_path)


def test_del_impossible_keeps_what_a_later_del_needs_and_frees_the_rest(forgotten: Forgotten, tmp_path: Path) -> None:
    """A plugin not known to be stateless may keep state only its DEL frees: while that DEL
    fails, its cache entry and the pin it is passed stay (needs_plugin), and so do the lease and
    the masquerade chain of the address still configured in that pin (issue 31); the rest is
    freed. Once DEL can succeed, the next pass frees them."""
    lab = forgotten.lab
    missing = lab.make_leak(with_cache=True)
    rewrite_cached_config(missing, [{"type": "bridge-that-is-not-installed"}])
    failing = lab.make_leak(with_cache=True)
    spec = lab.network_spec
    rewrite_cached_config(failing, [*spec.plugins("normal"), {"type": labcni.FAIL_PLUGIN}])

    allow = ("--allow-plugin", "bridge-that-is-not-installed", "--allow-plugin", labcni.FAIL_PLUGIN)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, *allow)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr  # not everything could be freed
    needed = [f"netns {leak.netns_path.name}" for leak in (missing, failing)]
    kept_with_pin = {f"lease {missing.ip}", "chains"}
    assert set(leak_left(lab, missing)) - {f"veth {missing.host_veth}"} == {needed[0], "cache entry", *kept_with_pin}
    assert set(leak_left(lab, failing)) - {f"veth {failing.host_veth}"} == {needed[1], "cache entry"}
    gone = reclaimed(run, missing.container_id)
    assert gone["needs_plugin"] == "bridge-that-is-not-installed"
    assert any("not found" in e for e in gone["plugin_errors"])
    (lease,) = [r for r in gone["resources"] if r["kind"] == "ipam"]
    assert lease["method"] == "kernel" and not lease["ok"], lease
    assert lease["error"].startswith(f"kept: its address stays configured in the netns that netns {needed[0][6:]}")
    # libcni stops at the first failing plugin (the last one, as DEL runs in reverse); the
    # reaper goes on, so bridge still released the lease through host-local.
    went = reclaimed(run, failing.container_id)
    assert went["needs_plugin"] == labcni.FAIL_PLUGIN
    assert any("reaper-fail" in e for e in went["plugin_errors"])
    assert {r["kind"]: r["method"] for r in went["resources"]}["ipam"] == "cni-del"

    for leak in (missing, failing):
        rewrite_cached_config(leak, spec.plugins("normal"))
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert leak_left(lab, missing) == [] and leak_left(lab, failing) == []
    assert_live_intact(forgotten, tmp_path)


def test_a_hanging_plugin_is_killed_with_its_children(forgotten: Forgotten, tmp_path: Path) -> None:
    lab = forgotten.lab
    lab.install_plugin("reaper-hang", HANG_PLUGIN)
    leak = lab.make_leak(with_cache=True)
    rewrite_cached_config(leak, [*lab.network_spec.plugins("normal"), {"type": "reaper-hang"}])
    # The plugin and its child each sleep 600 s: a run that waited for either would outlast
    # run_reaper's own timeout (120 s), which fails the test. The message and the processes
    # left say the DEL was killed at its deadline, with its process group.
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--plugin-timeout", "2s",
                     "--allow-plugin", "reaper-hang")  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr  # its DEL never succeeded
    outcome = reclaimed(run, leak.container_id)
    assert any("timed out after 2s" in e for e in outcome["plugin_errors"])
    assert outcome["needs_plugin"] == "reaper-hang" and "cache entry" in leak_left(lab, leak)
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, "reaper-hang")]
    assert leftovers == [], "the plugin's process group was killed"
    rewrite_cached_config(leak, lab.network_spec.plugins("normal"))
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0 and leak_left(lab, leak) == []
    assert_live_intact(forgotten, tmp_path)


def _cmdline_has(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_max_reap_and_the_breaker(forgotten: Forgotten, tmp_path: Path) -> None:
    lab = forgotten.lab
    # The counts below are of this test's leaks alone: what earlier tests of the module left (the
    # forgotten sandboxes, when it runs first or one of them failed) goes first.
    settled = run_reaper(lab, "reap", tmp_path / "settle.json", "--json", *REAP)
    assert settled.returncode == 0, settled.stdout[-3000:] + settled.stderr
    leaks = [lab.make_leak(with_cache=True) for _ in range(6)]
    state = tmp_path / "state.json"
    # 6 orphans against 4 live attachments: over the default ratio of 0.5.
    run = run_reaper(lab, "reap", state, "--json", "--min-age", "0", "--confirmations", "1")
    assert run.returncode == 3
    assert run.doc["breaker"]["open"] and run.doc["reclaimed"] == []
    assert "breaker open" in run.stderr.strip().splitlines()[-1]
    assert all(leak_left(lab, leak) for leak in leaks), "the breaker reclaimed nothing"
    # --force, but at most two a pass.
    run = run_reaper(
        lab, "reap", state, "--json", "--min-age", "0", "--confirmations", "1", "--force", "--max-reap", "2"
    )
    assert run.returncode == 0
    assert len(run.doc["reclaimed"]) == 2 and len(run.doc["skipped"]) == 4
    assert all("max-reap" in s["reason"] for s in run.doc["skipped"])
    assert sum(1 for leak in leaks if not leak_left(lab, leak)) == 2
    run = run_reaper(lab, "reap", state, "--json", *REAP, "--max-reap", "10")
    assert run.returncode == 0 and len(run.doc["reclaimed"]) == 4
    assert all(leak_left(lab, leak) == [] for leak in leaks)
    assert_live_intact(forgotten, tmp_path)


def test_dry_run_changes_nothing_and_shows_the_plan(forgotten: Forgotten, tmp_path: Path) -> None:
    lab = forgotten.lab
    leak = lab.make_leak(with_cache=True)
    run = run_reaper(lab, "reap", tmp_path / "state.json", *REAP, "--dry-run")
    assert run.returncode == 1  # orphans found, not reclaimed
    assert "PLAN (dry run, nothing changed)" in run.stdout
    assert f"cni-del    veth {leak.host_veth}" in run.stdout
    assert len(leak_left(lab, leak)) == 5
    run = run_reaper(lab, "reap", tmp_path / "state.json", *REAP)
    assert run.returncode == 0 and leak_left(lab, leak) == []
    assert_live_intact(forgotten, tmp_path)


def test_quarantine_keeps_the_files(forgotten: Forgotten, tmp_path: Path) -> None:
    lab = forgotten.lab
    leak = lab.make_leak(with_cache=True)
    assert leak.cache_path is not None
    lease, cache = leak.lease_path.read_bytes(), leak.cache_path.read_bytes()
    qdir = tmp_path / "quarantine"
    run = run_reaper(
        lab, "reap", tmp_path / "state.json", "--json", *REAP, "--method", "kernel", "--quarantine-dir", str(qdir)
    )
    assert run.returncode == 0, run.stdout[-2000:]
    assert leak_left(lab, leak) == []
    kept = {p.name: p for p in qdir.rglob("*") if p.is_file()}
    assert kept[leak.ip].read_bytes() == lease and kept[leak.cache_path.name].read_bytes() == cache
    assert str(kept[leak.ip]).endswith(str(leak.lease_path))
    assert stat.S_IMODE(kept[leak.ip].parent.stat().st_mode) == 0o700
    methods = {r["kind"]: r["method"] for r in reclaimed(run, leak.container_id)["resources"]}
    assert methods["ipam"] == "quarantine" and methods["cache"] == "quarantine" and methods["netns"] == "kernel"
    assert_live_intact(forgotten, tmp_path)


def test_what_is_not_a_cni_leak_is_never_touched(forgotten: Forgotten, tmp_path: Path) -> None:
    lab, net = forgotten.lab, forgotten.lab.network_name
    dead = secrets.token_hex(32)
    # A lease symlinked to a file elsewhere: reported, never followed, never deleted through.
    victim = tmp_path / "victim"
    victim.write_text(f"{dead}\r\neth0")
    link = lab.ipam_dir / net / "10.123.250.201"
    link.symlink_to(victim)
    # A cache entry that names the host's netns, and an admin's pin with a name no runtime makes.
    hostile = lab.cache_dir / "results" / f"{net}-{dead}-eth1"
    hostile.write_text(json.dumps({"kind": "cniCacheV1", "containerId": dead, "networkName": net,
                                   "ifName": "eth1", "config": "", "netns": "/proc/1/ns/net"}))  # fmt: skip
    admin = lab.make_pin("admin-test")
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-2000:]
        assert victim.read_bytes() == f"{dead}\r\neth0".encode() and link.is_symlink()
        assert any(c["path"] == str(link) and "symlink" in c["error"] for c in run.doc["corrupt"])
        assert hostile.exists()
        host_key = (dead, net, "eth1")
        assert attachments_by_key(run.doc)[host_key]["verdict"] == "live"
        assert admin.exists() and any(p["name"] == "admin-test" for p in run.doc["foreign_netns"])
        assert_live_intact(forgotten, tmp_path)
    finally:
        link.unlink()
        hostile.unlink()


def nft_handles(lab: Lab, family: str, table: str) -> dict[str, int]:
    """comment -> handle of every rule in the table."""
    out = lab.run_in_netns(["nft", "-j", "list", "table", family, table], check=True).stdout
    rules = [i["rule"] for i in json.loads(out)["nftables"] if "rule" in i]
    return {r.get("comment", ""): r["handle"] for r in rules}


def test_nft_rules_are_reclaimed_by_their_key_and_a_live_pods_stay(forgotten: Forgotten, tmp_path: Path) -> None:
    """Plugins >= 1.6 cut the container ID in a masquerade rule's comment when the network's
    name is long (the lab's is): the rule goes with its attachment by the instance hash, a live
    pod's rule stays, and a rule whose key matches nothing here is reported, never deleted."""
    lab, net = forgotten.lab, forgotten.lab.network_name
    leak = lab.make_leak(with_cache=False)
    stranger = secrets.token_hex(32)
    comments = {who: labcni.masq_comment(net, "eth0", who) for who in (leak.container_id, forgotten.web, stranger)}
    script = "table inet cni_plugins_masquerade {\n  chain masq_checks {\n"
    for who, ip in ((leak.container_id, leak.ip), (forgotten.web, lab.pod_ip(forgotten.web)), (stranger, "10.9.9.8")):
        script += f'    ip saddr {ip} ip daddr != {lab.subnet} masquerade comment "{comments[who]}"\n'
    script += "  }\n}\n"
    lab.run_in_netns(["nft", "-f", "-"], input=script, check=True)
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        left = nft_handles(lab, "inet", "cni_plugins_masquerade")
        assert comments[leak.container_id] not in left and leak_left(lab, leak) == []
        assert comments[forgotten.web] in left and comments[stranger] in left
        assert [u["instance"] for u in run.doc["unconfirmed"]] == [comments[stranger][:33]]
    finally:
        lab.run_in_netns(["nft", "delete", "table", "inet", "cni_plugins_masquerade"])
    assert_live_intact(forgotten, tmp_path)  # with the table gone, as they were before it


def test_an_address_held_off_the_node_keeps_the_entry_its_plugin_needs(forgotten: Forgotten, tmp_path: Path) -> None:
    """IPAM that keeps its state elsewhere (dhcp here, calico-ipam, whereabouts, Cilium, AWS on
    real nodes) releases an address only through its own DEL, which needs the cache entry: when
    that DEL fails, the entry stays and the attachment says it needs the plugin."""
    lab, net = forgotten.lab, forgotten.lab.network_name
    dead = secrets.token_hex(32)
    pin = lab.make_pin()
    config = {
        "cniVersion": "1.0.0",
        "name": net,
        "plugins": [{"type": "bridge", "bridge": lab.bridge, "ipam": {"type": "dhcp"}}],
    }
    entry = lab.cache_dir / "results" / f"{net}-{dead}-eth0"
    entry.write_text(json.dumps(cache_doc(dead, net, config=config, netns=str(pin), cniArgs=[["IgnoreUnknown", "1"]])))
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--allow-plugin", "dhcp")
        assert run.returncode == 1, run.stdout[-2000:] + run.stderr  # not everything could be freed
        outcome = reclaimed(run, dead)
        assert outcome["needs_plugin"] == "dhcp" and any("dhcp" in e for e in outcome["plugin_errors"])
        kept = next(r for r in outcome["resources"] if r["kind"] == "cache")
        assert not kept["ok"] and "dhcp" in kept["error"] and entry.exists()
        assert pin.exists()  # the CNI_NETNS a later DEL is passed, as the runtime would
    finally:
        entry.unlink(missing_ok=True)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)  # the pin alone now
    assert run.returncode == 0 and not pin.exists()
    assert_live_intact(forgotten, tmp_path)


def test_an_ipv6_range_is_reclaimed(forgotten: Forgotten, tmp_path: Path) -> None:
    lab = forgotten.lab
    net6 = f"{lab.network_name}-v6"
    conflist = {
        "cniVersion": "1.0.0",
        "name": net6,
        "plugins": [
            {
                "type": "bridge",
                "bridge": f"{lab.bridge[:-1]}6",
                "isGateway": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "fd00:123:4::/64"}]],
                    "dataDir": str(lab.ipam_dir),
                },
            }
        ],
    }
    conf = lab.conf_dir / f"20-{net6}.conflist"
    conf.write_text(json.dumps(conflist))
    try:
        cid = secrets.token_hex(32)
        pin = lab.make_pin()
        call = labcni.PluginCall("ADD", cid, str(pin), "eth0", (("IgnoreUnknown", "1"),), lab.bin_dir, lab.netns_path)
        result = labcni.add_network_list(conflist, call, {})
        ip = labcni.result_ip(result)
        assert ":" in ip
        lease = lab.ipam_dir / net6 / ip
        assert lease.exists()
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-2000:]
        assert not lease.exists() and not pin.exists()
        ranges = {r["network"]: r for r in run.doc["ipam_ranges"]}
        assert ranges[net6]["range"] == "fd00:123:4::/64" and ranges[net6]["used"] == 1
        assert_live_intact(forgotten, tmp_path)
    finally:
        conf.unlink()


@contextlib.contextmanager
def gc_probe(lab: Lab) -> Iterator[Path]:
    """The lab's network at CNI 1.1.0 with a GC-recording plugin, and one with GC disabled;
    yields the file each call is recorded in."""
    net = lab.network_name
    lab.install_plugin("reaper-gc-probe", script(gc_recorder))
    calls = lab.bin_dir / "gc-calls.jsonl"
    gc_conf = lab.conf_dir / "30-gc.conflist"
    gc_conf.write_text(json.dumps({"cniVersion": "1.1.0", "name": net, "plugins": [{"type": "reaper-gc-probe"}]}))
    off = lab.conf_dir / "31-nogc.conflist"
    off.write_text(json.dumps({"cniVersion": "1.1.0", "name": "nogc", "disableGC": True,
                               "plugins": [{"type": "reaper-gc-probe"}]}))  # fmt: skip
    try:
        yield calls
    finally:
        gc_conf.unlink()
        off.unlink()
        calls.unlink(missing_ok=True)


def test_the_cni_gc_verb_is_never_sent_and_its_removed_flag_is_refused(forgotten: Forgotten, tmp_path: Path) -> None:
    """The spec wants GC exclusive of every ADD and DEL of the network, which only the runtime
    can promise; the reaper never sends it, and `--cni-gc` (removed) is refused by name."""
    lab = forgotten.lab
    leak = lab.make_leak(with_cache=True)
    with gc_probe(lab) as calls:
        refused = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--cni-gc")
        assert refused.returncode == 2 and "--cni-gc" in refused.stderr, refused.stderr
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        assert leak_left(lab, leak) == []
        recorded = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
        assert "GC" not in {c["command"] for c in recorded}
        assert "gc" not in run.doc
    assert_live_intact(forgotten, tmp_path)


def test_the_state_dir_of_the_runtime_was_really_wiped(forgotten: Forgotten) -> None:
    # Guard on the fixture: the seeds are unknown to the runtime, so their leaks are real leaks.
    names = {s.metadata.name for s in forgotten.lab.sandboxes()}
    assert names == {"web", "db"}
    assert os.path.isdir(forgotten.lab.netns_dir)


@pytest.mark.usefixtures("seeds")
def test_a_stale_cache_entry_naming_a_live_pods_veth_takes_nothing_of_it(lab: Lab, web: str, tmp_path: Path) -> None:
    """AWS VPC CNI and Calico name the host veth after the pod, so a recreated StatefulSet pod
    gets its predecessor's veth name, and the predecessor's stale cache entry names the live
    pod's veth. The veth belongs where its peer lives."""
    web_pin = lab.pod_netns_path(web)
    assert web_pin is not None
    web_veth = lab.host_veth_of(web_pin)
    assert web_veth is not None
    gone = secrets.token_hex(32)  # the predecessor: its sandbox is gone, its files stayed
    net = lab.network_name
    lease = lab.ipam_dir / net / "10.123.250.97"
    lease.write_bytes(f"{gone}\r\neth0".encode())
    interfaces = [{"name": web_veth}, {"name": "eth0", "sandbox": "/var/run/netns/gone"}]
    result = {"cniVersion": "1.0.0", "interfaces": interfaces, "ips": [{"address": "10.123.250.97/24", "interface": 1}]}
    stale = lab.cache_dir / "results" / f"{net}-{gone}-eth0"
    stale.write_text(json.dumps(cache_doc(gone, net, netns="/var/run/netns/gone", result=result)))
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        predecessor = attachments_by_key(run.doc)[(gone, net, "eth0")]
        assert sorted(r["kind"] for r in predecessor["resources"]) == ["cache", "ipam"]
        assert not lease.exists() and not stale.exists()
        assert lab.host_veth_of(web_pin) == web_veth and pings(lab, web)
    finally:
        lease.unlink(missing_ok=True)
        stale.unlink(missing_ok=True)


def test_a_cache_entry_never_tells_where_a_sandbox_lives(
    lab: Lab, web: str, seeds: tuple[str, str], tmp_path: Path
) -> None:
    """A cache entry that gives the seed sandbox (NOTREADY, nothing inside its netns) a netns
    path of its choosing: the runtime's PodSandboxStatus is what counts, so the sandbox's real
    pin stays tied to it and is never taken for an orphan."""
    _, nocni = seeds
    pin = lab.pod_netns_path(nocni)
    assert pin is not None
    net = lab.network_name
    forged = lab.cache_dir / "results" / f"{net}-{nocni}-eth0"
    forged.write_text(json.dumps(cache_doc(nocni, net, netns="/var/run/netns/elsewhere")))
    try:
        for _ in range(2):  # the state file carries nothing from the forged entry to the next pass
            run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
            assert run.returncode == 0, run.stdout[-2000:] + run.stderr
            assert pin.exists() and run.doc["reclaimed"] == []
        owner = [a for a in run.doc["attachments"] if any(r.get("path") == str(pin) for r in a["resources"])]
        assert [a["container_id"] for a in owner] == [nocni] and owner[0]["verdict"] == "live"
        assert pings(lab, web)
    finally:
        forged.unlink(missing_ok=True)


def test_a_sandbox_listed_again_at_the_recheck_is_left_alone(
    lab: Lab, web: str, seeds: tuple[str, str], tmp_path: Path
) -> None:
    chained, nocni = seeds
    pins = {p.name for p in lab.netns_dir.iterdir()}
    lease_count = len(list((lab.ipam_dir / lab.network_name).glob("10.*")))
    doc = racing_reap(lab, "reappear", [chained, nocni], tmp_path / "state.json")
    # Hidden from the first list, the two seed sandboxes' resources looked orphaned ...
    orphans = {a["container_id"] for a in doc["attachments"] if a["verdict"] == "orphan"}
    assert chained in orphans
    # ... but the re-check listed them again, so nothing of theirs was touched.
    assert doc["reclaimed"] == []
    reasons = {s["container_id"]: s["reason"] for s in doc["skipped"]}
    assert "listed again" in reasons[chained]
    assert any("listed now" in r for c, r in reasons.items() if c is None)
    assert {p.name for p in lab.netns_dir.iterdir()} == pins
    assert len(list((lab.ipam_dir / lab.network_name).glob("10.*"))) == lease_count
    assert lab.run_in_netns(["ping", "-c", "1", "-W", "2", lab.pod_ip(web)]).returncode == 0


def test_the_recheck_is_made_per_attachment_right_before_its_del(
    lab: Lab, web: str, seeds: tuple[str, str], tmp_path: Path
) -> None:
    """A sandbox hidden from the scan and from the re-check of the whole plan, listed again by
    the time its own DEL would run: it is left, and so is everything of its."""
    chained, nocni = seeds
    pins = {p.name for p in lab.netns_dir.iterdir()}
    doc = racing_reap(lab, "reappear-late", [chained, nocni], tmp_path / "state.json")
    assert chained in {a["container_id"] for a in doc["attachments"] if a["verdict"] == "orphan"}
    assert doc["reclaimed"] == []
    reasons = {s["container_id"]: s["reason"] for s in doc["skipped"]}
    assert "listed again" in reasons[chained]
    assert {p.name for p in lab.netns_dir.iterdir()} == pins and pings(lab, web)


def test_runtime_unreachable_at_the_recheck_reclaims_nothing(
    lab: Lab, web: str, seeds: tuple[str, str], tmp_path: Path
) -> None:
    chained, nocni = seeds
    leak = lab.make_leak(with_cache=True)
    doc = racing_reap(lab, "unreachable", [], tmp_path / "state.json")
    assert doc["recheck_error"] == "connection refused (injected)"
    assert doc["reclaimed"] == []
    assert any(s["container_id"] == leak.container_id and "unreachable" in s["reason"] for s in doc["skipped"])
    assert len(leak_left(lab, leak)) == 5
    # With the runtime back, the same pass reclaims it, and the runtime's own sandboxes stay.
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0 and leak_left(lab, leak) == []
    assert {a["container_id"] for a in run.doc["attachments"] if a["verdict"] == "orphan"} == {leak.container_id}
    live = {a["container_id"] for a in run.doc["attachments"] if a["verdict"] == "live"}
    assert {chained, nocni, web} <= live
    assert lab.run_in_netns(["ping", "-c", "1", "-W", "2", lab.pod_ip(web)]).returncode == 0


@pytest.mark.usefixtures("seeds")
def test_a_runtime_lost_during_the_pass_leaves_the_rest_and_the_pass_undecided(
    lab: Lab, web: str, tmp_path: Path
) -> None:
    leak = lab.make_leak(with_cache=True)
    doc = racing_reap(lab, "unreachable-late", [], tmp_path / "state.json")
    assert doc["recheck_error"] == "connection refused (injected)" and doc["reclaimed"] == []
    assert any(s["container_id"] == leak.container_id and "unreachable" in s["reason"] for s in doc["skipped"])
    assert len(leak_left(lab, leak)) == 5 and pings(lab, web)
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0 and leak_left(lab, leak) == []


@pytest.mark.usefixtures("seeds")
def test_runtime_down_reclaims_nothing(lab: Lab, tmp_path: Path) -> None:
    leak = lab.make_leak(with_cache=False)
    lab.stop_runtime()
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, "--runtime-timeout", "2s")
        assert run.returncode == 2
        assert run.doc["reclaimed"] == [] and {a["verdict"] for a in run.doc["attachments"]} == {"unknown"}
        assert "runtime unreachable" in run.stderr.strip().splitlines()[-1]
        assert len(leak_left(lab, leak)) == 4  # netns, veth, lease, chains (no cache entry)
    finally:
        lab.start_runtime()
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0 and leak_left(lab, leak) == []


def test_chains_in_the_legacy_iptables_backend(forgotten: Forgotten, tmp_path: Path) -> None:
    # Nodes where plugins wrote with iptables-legacy while the default is nft (or the other way
    # round) have CNI chains in both; each is read and removed with its own backend's tools.
    lab, net, web = forgotten.lab, forgotten.lab.network_name, forgotten.web
    dead = secrets.token_hex(32)
    # The dead container's lease makes its attachment; a chain alone would prove no owner dead.
    (lab.ipam_dir / net / "10.123.250.99").write_bytes(f"{dead}\r\neth0".encode())
    lines = ["*nat"]
    for cid, ip in ((dead, "10.123.250.99"), (web, lab.pod_ip(web))):
        chain = chain_name("", net, cid)
        comment = f'"name: \\"{net}\\" id: \\"{cid}\\""'
        lines += [f":{chain} - [0:0]", f"-A {chain} -d {lab.subnet} -m comment --comment {comment} -j ACCEPT"]
        lines.append(f"-A POSTROUTING -s {ip}/32 -m comment --comment {comment} -j {chain}")
    lines.append("COMMIT")
    lab.run_in_netns(["iptables-legacy-restore", "--noflush"], input="\n".join(lines) + "\n", check=True)
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-2000:]
        legacy = lab.run_in_netns(["iptables-legacy-save", "-t", "nat"], check=True).stdout
        assert chain_name("", net, dead) not in legacy, "the dead container's legacy chain is gone"
        assert not (lab.ipam_dir / net / "10.123.250.99").exists()
        assert f":{chain_name('', net, web)} " in legacy, "the live pod's legacy chain stays"
        live = attachments_by_key(run.doc)[(web, net, "eth0")]
        backends = {r.get("backend") for r in live["resources"] if r["kind"] == "iptables"}
        assert backends == {"nft", "legacy"} and live["verdict"] == "live"
    finally:
        chain = chain_name("", net, web)
        comment = f'"name: \\"{net}\\" id: \\"{web}\\""'
        cleanup = f"*nat\n-D POSTROUTING -s {lab.pod_ip(web)}/32 -m comment --comment {comment} -j {chain}\n"
        cleanup += f"-F {chain}\n-X {chain}\nCOMMIT\n"
        lab.run_in_netns(["iptables-legacy-restore", "--noflush"], input=cleanup)
    assert_live_intact(forgotten, tmp_path)


def test_a_leak_whose_netns_a_mount_holds_elsewhere_keeps_everything_until_it_goes(
    forgotten: Forgotten, tmp_path: Path
) -> None:
    """containerd#3667, moby#27277, cri-o#4210 on the real runtime's plugins: a process in a
    mount namespace of its own bind-mounted a dead pod's netns, then the pod's pin was removed.
    The namespace, its veth and its address live on. The reap leaves all of it (the veth tied
    to the held namespace and live with the holder named; the lease, chain and cache entry,
    which name only the pin that is gone, kept because the address is configured there) and
    never touches the holder's mount; a leak beside it goes. Once the holder is gone, the next
    reap frees the rest."""
    lab = forgotten.lab
    leak, control = lab.make_leak(with_cache=True), lab.make_leak(with_cache=True)
    held = tmp_path / "held"
    held.touch()
    argv = ["unshare", "--mount", "--propagation", "private", *probe_argv(bind_holder)]
    holder = subprocess.Popen(
        [*argv, str(leak.netns_path), str(held)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        kernel.umount(str(leak.netns_path), 2)  # the runtime removes its pin, as it does
        leak.netns_path.unlink()
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
        assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr
        assert leak_left(lab, leak) == ["veth " + leak.host_veth, f"lease {leak.ip}", "cache entry", "chains"]
        assert leak_left(lab, control) == []
        (tied,) = [a for a in run.doc["attachments"] if leak.host_veth in {r["name"] for r in a["resources"]}]
        assert tied["verdict"] == "live" and {r["kind"] for r in tied["resources"]} == {"veth", "heldns"}
        assert f"pid {holder.pid}" in tied["reason"] and str(held) in tied["reason"]
        skipped = {s["container_id"]: s["reason"] for s in run.doc["skipped"]}
        assert leak.ip in skipped[leak.container_id] and f"pid {holder.pid}" in skipped[leak.container_id]
        with open(f"/proc/{holder.pid}/mountinfo", encoding="utf-8") as f:
            assert any(line.split(" ")[4] == str(held) for line in f), "the holder's mount was touched"
    finally:
        holder.kill()
        holder.wait()
    for _ in range(50):  # the namespace, and its veth, die with the holder's mount namespace
        if leak.host_veth not in host_links(lab):
            break
        time.sleep(0.1)
    run = run_reaper(lab, "reap", tmp_path / "state2.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert leak_left(lab, leak) == []
    assert_live_intact(forgotten, tmp_path)
