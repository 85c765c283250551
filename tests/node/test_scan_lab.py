"""`reaper scan` against a real containerd, real plugins and real leaks, in a private lab."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from reaper.kinds.iptables import chain_name
from tests.harness.lab import Lab, Leak, PodAttempt, PortMap
from tests.harness.lab.cni import masq_comment
from tests.harness.reaper_cli import attachments_by_key, kinds, names, run_reaper

FAST = ("--min-age", "0", "--confirmations", "1", "--stuck-after", "0")


@dataclass(frozen=True)
class World:
    lab: Lab
    web: str  # live pod with a hostPort
    db: str  # live pod
    gone: str  # created, stopped and removed properly: leaves nothing
    chained: PodAttempt  # seed report: a later plugin fails ADD (NOTREADY, no cache entry)
    nocni: PodAttempt  # seed report: CNI not configured (NOTREADY, only a netns)
    cached_leak: Leak  # runtime never saw it, full ADD with a cache entry and a hostPort
    bare_leak: Leak  # runtime never saw it, no cache entry


@pytest.fixture(scope="module")
def world(lab: Lab) -> World:
    web = lab.run_pod("web", port_mappings=[PortMap(8080, 80)])
    db = lab.run_pod("db")
    gone = lab.run_pod("gone")
    lab.stop_pod(gone)
    lab.remove_pod(gone)
    lab.set_network("failing")
    chained = lab.try_run_pod("chained")
    lab.set_network("empty")
    nocni = lab.try_run_pod("nocni")
    lab.set_network("normal")
    assert chained.sandbox_id and not chained.ok and nocni.sandbox_id and not nocni.ok
    cached = lab.make_leak(with_cache=True, port_mappings=[PortMap(9090, 90)])
    bare = lab.make_leak(with_cache=False)
    return World(lab, web, db, gone, chained, nocni, cached, bare)


def _pin_name(lab: Lab, sandbox_id: str) -> str:
    path = lab.pod_netns_path(sandbox_id)
    assert path is not None
    return path.name


def test_every_attachment_gets_exactly_its_verdict(world: World, tmp_path: Path) -> None:
    lab = world.lab
    run = run_reaper(lab, "scan", tmp_path / "state.json", "--json", *FAST)
    assert run.returncode == 1, run.stderr
    doc = run.doc
    net = lab.network_name
    got = attachments_by_key(doc)
    web, db = world.web, world.db
    chained, nocni = world.chained.sandbox_id, world.nocni.sandbox_id
    cached, bare = world.cached_leak, world.bare_leak
    assert chained is not None and nocni is not None
    expected = {
        (web, net, "eth0"): ("live", ["cache", "ipam", "iptables", "iptables", "netns", "veth"]),
        (web, "cni-loopback", "lo"): ("live", ["cache"]),
        (db, net, "eth0"): ("live", ["cache", "ipam", "iptables", "netns", "veth"]),
        (db, "cni-loopback", "lo"): ("live", ["cache"]),
        (chained, net, "eth0"): ("live", ["ipam", "iptables", "netns", "veth"]),
        (nocni, None, None): ("live", ["netns"]),
        (cached.container_id, net, "eth0"): ("orphan", ["cache", "ipam", "iptables", "iptables", "netns", "veth"]),
        (bare.container_id, net, "eth0"): ("orphan", ["ipam", "iptables"]),
        (None, None, bare.netns_path.name): ("orphan", ["netns", "veth"]),
    }
    assert {k: (a["verdict"], kinds(a)) for k, a in got.items()} == expected
    assert all(a["container_id"] != world.gone for a in doc["attachments"])
    # containerd passes K8S_POD_NAMESPACE in CNI_ARGS, and its cache entries keep it.
    owners = {k: a["owner"] for k, a in got.items()}
    assert owners[(web, net, "eth0")] == owners[(web, "cni-loopback", "lo")] == "cri"
    assert owners[(bare.container_id, net, "eth0")] == "unknown"  # no cache entry to tell by

    # The resources are the ones the runtime and the plugins made, by name.
    leak = got[(cached.container_id, net, "eth0")]
    assert names(leak, "netns") == {cached.netns_path.name}
    assert names(leak, "veth") == {cached.host_veth}
    assert names(leak, "ipam") == {f"{net}/{cached.ip}"}
    assert names(leak, "iptables") == {cached.masq_chain, chain_name("DN-", net, cached.container_id)}
    assert names(leak, "cache") == {cached.cache_path.name if cached.cache_path else ""}
    assert names(got[(None, None, bare.netns_path.name)], "veth") == {bare.host_veth}
    assert names(got[(bare.container_id, net, "eth0")], "ipam") == {f"{net}/{bare.ip}"}
    assert names(got[(web, net, "eth0")], "netns") == {_pin_name(lab, web)}
    assert names(got[(chained, net, "eth0")], "netns") == {_pin_name(lab, chained)}
    assert names(got[(nocni, None, None)], "netns") == {_pin_name(lab, nocni)}
    assert "NOTREADY" in got[(chained, net, "eth0")]["reason"]

    assert doc["summary"] == {"live": 6, "orphan": 3, "pending": 0, "unknown": 0, "excluded": 0, "waiting": 0}
    assert doc["live_sandboxes"] == 4
    assert doc["runtime"]["reachable"] is True and doc["runtime"]["name"] == "containerd"
    stuck = {s["id"]: s for s in doc["stuck_sandboxes"]}
    assert set(stuck) == {chained, nocni}
    assert sorted(r["kind"] for r in stuck[chained]["resources"]) == ["ipam", "iptables", "netns", "veth"]
    assert stuck[nocni]["name"] == "nocni" and stuck[nocni]["namespace"] == "default"
    assert doc["ipam_ranges"] == [{"network": net, "range": lab.subnet, "size": 253, "used": 5}]
    assert doc["corrupt"] == [] and doc["errors"] == []


def test_grace_period_and_confirmations(world: World, tmp_path: Path) -> None:
    lab, state = world.lab, tmp_path / "state.json"
    # Defaults: nothing a minute old is an orphan.
    young = run_reaper(lab, "scan", tmp_path / "defaults.json", "--json")
    assert young.returncode == 0, young.stderr
    verdicts = {a["verdict"] for a in young.doc["attachments"]}
    assert verdicts == {"live", "pending"}
    assert young.doc["summary"]["pending"] == 3
    # Old enough, but seen ownerless on only one of two passes.
    first = run_reaper(lab, "scan", state, "--json", "--min-age", "0", "--confirmations", "2")
    assert first.returncode == 0 and first.doc["summary"]["orphan"] == 0 and first.doc["summary"]["pending"] == 3
    # A run right after is the same look: a pass counts half of --interval (30s) after the last.
    again = run_reaper(lab, "scan", state, "--json", "--min-age", "0", "--confirmations", "2")
    assert again.returncode == 0 and again.doc["summary"]["pending"] == 3
    time.sleep(0.5)  # half of the 1s interval below, since the first run counted
    spaced = ("env", "REAPER_INTERVAL=1s")
    second = run_reaper(lab, "scan", state, "--json", "--min-age", "0", "--confirmations", "2", wrap=spaced)
    assert second.returncode == 1 and second.doc["summary"]["orphan"] == 3
    assert oct(os.stat(state).st_mode & 0o777) == "0o600"


def test_table_output_is_readable(world: World, tmp_path: Path) -> None:
    run = run_reaper(world.lab, "scan", tmp_path / "state.json", *FAST)
    assert run.returncode == 1
    lines = run.stdout.splitlines()
    assert lines[0].startswith("runtime: containerd")
    assert "ORPHAN (3)" in lines and "LIVE (6)" in lines
    assert any(line.startswith("STUCK SANDBOXES (2)") for line in lines)
    assert world.cached_leak.host_veth in run.stdout
    assert lines[-1] == "attachments: live 6, orphan 3, pending 0, unknown 0, excluded 0, waiting 0"
    assert "Traceback" not in run.stderr


def test_junk_in_every_directory_is_reported_not_fatal(world: World, tmp_path: Path) -> None:
    lab = world.lab
    net_dir = lab.ipam_dir / lab.network_name
    results = lab.cache_dir / "results"
    junk: dict[Path, str] = {
        net_dir / "10.123.250.250": "invalid container ID",
        net_dir / "not-an-ip": "not an IP address",
        net_dir / "10.123.250.251": "not UTF-8",
        net_dir / "10.123.250.252": "limit",
        results / f"{lab.network_name}-{'0' * 64}-eth0": "empty file",
        results / "truncated": "truncated",
        results / "binary": "truncated",
        results / "otherkind": "unknown cache kind",
        lab.conf_dir / "99-broken.conflist": "invalid JSON",
    }
    links = {
        net_dir / "10.123.250.253": "/etc/passwd",
        results / "link": "/etc/passwd",
        lab.netns_dir / "cni-11111111-2222-3333-4444-555555555555-link": "/proc/1/ns/net",
    }
    stale = lab.netns_dir / "cni-00000000-0000-0000-0000-000000000000"
    contents = {
        net_dir / "10.123.250.250": b"../../etc\r\neth0",
        net_dir / "not-an-ip": b"x",
        net_dir / "10.123.250.251": b"\xff\xfe\xfd",
        net_dir / "10.123.250.252": b"a" * 100_000,
        results / f"{lab.network_name}-{'0' * 64}-eth0": b"",
        results / "truncated": b'{"kind": "cniCacheV1", "containerId": "ab',
        results / "binary": b"\x00\x01\xff",
        results / "otherkind": b'{"kind": "cniCacheV9"}',
        lab.conf_dir / "99-broken.conflist": b"{not json",
    }
    try:
        for path, data in contents.items():
            path.write_bytes(data)
        for path, target in links.items():
            path.symlink_to(target)
        stale.write_bytes(b"")
        run = run_reaper(lab, "scan", tmp_path / "state.json", "--json", *FAST)
        assert run.returncode == 1, run.stderr
        assert "Traceback" not in run.stderr
        corrupt = {c["path"]: c["error"] for c in run.doc["corrupt"]}
        for path, reason in junk.items():
            assert reason in corrupt.get(str(path), ""), (path, corrupt.get(str(path)))
        for path in links:
            assert "symlink" in corrupt.get(str(path), ""), path
        # The stale pin (a plain file where a namespace was mounted) is a leak of its own.
        got = attachments_by_key(run.doc)
        stale_attachment = got[(None, None, stale.name)]
        assert stale_attachment["resources"][0].get("stale") is True
        assert stale_attachment["verdict"] == "orphan"
        # A zero-byte cache file whose name ties it to a (dead) container is a leak of its own:
        # libcni cannot DEL through it, so nothing else would ever remove it.
        empty = got[("0" * 64, lab.network_name, "eth0")]
        assert empty["verdict"] == "orphan" and empty["resources"][0]["corrupt"] == "empty file"
        # Everything else is judged as before.
        assert run.doc["summary"] == {"live": 6, "orphan": 5, "pending": 0, "unknown": 0, "excluded": 0, "waiting": 0}
    finally:
        for path in [*contents, *links, stale]:
            path.unlink(missing_ok=True)


def test_runtime_stopped_means_unknown_and_exit_2(world: World, tmp_path: Path) -> None:
    lab = world.lab
    lab.stop_runtime()
    try:
        run = run_reaper(lab, "scan", tmp_path / "state.json", "--json", *FAST, "--runtime-timeout", "2s")
        assert run.returncode == 2
        doc = run.doc
        assert doc["runtime"]["reachable"] is False and doc["runtime"]["error"]
        assert {a["verdict"] for a in doc["attachments"]} == {"unknown"}
        # Without the runtime, the chained sandbox's pin (and its veth) can no longer be tied to
        # its container ID, so it stands alone: 10 attachments instead of 9, all unknown.
        assert doc["summary"] == {"live": 0, "orphan": 0, "pending": 0, "unknown": 10, "excluded": 0, "waiting": 0}
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith("reaper: cannot decide: runtime unreachable")
        assert "Traceback" not in run.stderr
    finally:
        lab.start_runtime()


def test_nft_backend_rules_join_their_attachments_by_their_key(world: World, tmp_path: Path) -> None:
    # The Debian plugins (1.1.1) predate the nftables backend; these rules are written the way
    # plugins >= 1.6 write them (bridge ipMasq: the instance hash, then a description cut at 128
    # characters, in inet cni_plugins_masquerade; portmap: the container ID in ip cni_hostport).
    # The lab's network name is long enough for the description to cut the container ID short.
    lab, net = world.lab, world.lab.network_name
    leak, web = world.bare_leak, world.web
    stranger = "f" * 64  # an ID nothing on the node knows
    assert not masq_comment(net, "eth0", web).endswith(web)
    script = f"""
table inet cni_plugins_masquerade {{
  chain masq_checks {{
    ip saddr {leak.ip} ip daddr != {lab.subnet} masquerade comment "{masq_comment(net, "eth0", leak.container_id)}"
    ip saddr {lab.pod_ip(web)} ip daddr != {lab.subnet} masquerade comment "{masq_comment(net, "eth0", web)}"
    ip saddr 10.9.9.8 ip daddr != {lab.subnet} masquerade comment "{masq_comment(net, "eth0", stranger)}"
    ip saddr 10.9.9.9 masquerade comment "an admin's rule"
  }}
}}
table ip cni_hostport {{
  chain hostip_hostports {{
    tcp dport 7777 dnat to {leak.ip}:77 comment "{leak.container_id}"
    tcp dport 7778 dnat to 10.9.9.8:78 comment "{stranger}"
  }}
}}
"""
    lab.run_in_netns(["nft", "-f", "-"], input=script, check=True)
    try:
        run = run_reaper(lab, "scan", tmp_path / "state.json", "--json", *FAST)
        got = attachments_by_key(run.doc)
        bare = got[(leak.container_id, net, "eth0")]
        assert kinds(bare) == ["ipam", "iptables", "nft", "nft"]
        assert {n.split()[1] for n in names(bare, "nft")} == {"cni_plugins_masquerade", "cni_hostport"}
        assert bare["verdict"] == "orphan"
        live = got[(web, net, "eth0")]
        assert "nft" in kinds(live) and live["verdict"] == "live"
        # The cut IDs made no attachment of their own; the stranger's rules are unconfirmed.
        assert not any(cid and cid != web and web.startswith(cid) for cid, _, _ in got)
        unconfirmed = {u["name"].split()[1] for u in run.doc["unconfirmed"] if u["kind"] == "nft"}
        assert unconfirmed == {"cni_plugins_masquerade", "cni_hostport"}
        assert run.doc["summary"] == {"live": 6, "orphan": 3, "pending": 0, "unknown": 0, "excluded": 0, "waiting": 0}
    finally:
        lab.run_in_netns(["nft", "delete", "table", "inet", "cni_plugins_masquerade"])
        lab.run_in_netns(["nft", "delete", "table", "ip", "cni_hostport"])
