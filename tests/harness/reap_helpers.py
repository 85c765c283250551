"""Helpers the reclaim and fault tests share: what of a leak is left, the nat chains, a reap
pass whose runtime changes its answer."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.harness.lab import Lab, Leak
from tests.harness.plugins import hang, script
from tests.harness.reaper_cli import lab_flags

# A plugin that hangs on every command but VERSION, after starting a child of its own.
HANG_PLUGIN = script(hang)

SCAN = ("--min-age", "0", "--confirmations", "1")
REAP = (*SCAN, "--max-orphan-ratio", "1")


def pings(lab: Lab, pod: str) -> bool:
    """The pod answers a ping from the lab's netns: its network still works."""
    return lab.run_in_netns(["ping", "-c", "1", "-W", "2", lab.pod_ip(pod)]).returncode == 0


def host_links(lab: Lab) -> set[str]:
    return {link["ifname"] for link in json.loads(lab.run_in_netns(["ip", "-j", "link", "show"], check=True).stdout)}


def ifbs(lab: Lab) -> set[str]:
    """The IFB devices in the lab's netns."""
    out = lab.run_in_netns(["ip", "-j", "link", "show", "type", "ifb"], check=True).stdout
    return {link["ifname"] for link in json.loads(out)}


def qdiscs(lab: Lab, dev: str) -> str:
    return lab.run_in_netns(["tc", "qdisc", "show", "dev", dev], check=True).stdout


def firewall_rules_of(ip: str, bits: int = 32) -> set[str]:
    """The two rules the firewall plugin's iptables backend writes for `ip`, as iptables-save
    prints them."""
    return {
        f"-A CNI-FORWARD -d {ip}/{bits} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f"-A CNI-FORWARD -s {ip}/{bits} -j ACCEPT",
    }


def rule_specs(lines: set[str]) -> set[str]:
    """iptables-save lines as the reaper names the rules: without the `-A `."""
    return {line.removeprefix("-A ") for line in lines}


def filter_lines(lab: Lab) -> set[str]:
    """Every line of the lab netns' filter tables, both families, but iptables-save's comments
    (they carry the time)."""
    lines: set[str] = set()
    for save in ("iptables-save", "ip6tables-save"):
        out = lab.run_in_netns([save, "-t", "filter"], check=True).stdout
        lines.update(line for line in out.splitlines() if not line.startswith("#"))
    return lines


def cached_result(lab: Lab, container_id: str) -> dict[str, Any]:
    """The result in the libcni cache entry of the container's attachment to the lab's network."""
    path = lab.cache_dir / "results" / f"{lab.network_name}-{container_id}-eth0"
    result: dict[str, Any] = json.loads(path.read_bytes())["result"]
    return result


def nat_chains(lab: Lab) -> str:
    return lab.run_in_netns(["iptables-save", "-t", "nat"], check=True).stdout


def hostport_chains(lab: Lab) -> int:
    return sum(1 for line in nat_chains(lab).splitlines() if line.startswith(":CNI-DN-"))


def leak_left(lab: Lab, leak: Leak) -> list[str]:
    """The resources of `leak` still on the node."""
    left = []
    if leak.netns_path.exists():
        left.append(f"netns {leak.netns_path.name}")
    if leak.host_veth in host_links(lab):
        left.append(f"veth {leak.host_veth}")
    if leak.lease_path.exists():
        left.append(f"lease {leak.ip}")
    if leak.cache_path is not None and leak.cache_path.exists():
        left.append("cache entry")
    chains = nat_chains(lab)
    if leak.masq_chain in chains or leak.container_id in chains:
        left.append("chains")
    return left


def rewrite_cached_config(leak: Leak, plugins: list[dict[str, Any]]) -> None:
    """Make the leak's cache entry carry another plugin list (to make its DEL fail or hang)."""
    assert leak.cache_path is not None
    entry = json.loads(leak.cache_path.read_bytes())
    config = json.loads(base64.b64decode(entry["config"]))
    config["plugins"] = plugins
    entry["config"] = base64.b64encode(json.dumps(config).encode()).decode()
    leak.cache_path.write_text(json.dumps(entry))


def racing_reap(lab: Lab, mode: str, hide: list[str], state: Path, flags: tuple[str, ...] = REAP) -> dict[str, Any]:
    argv = [
        "nsenter",
        f"--net={lab.netns_path}",
        sys.executable,
        "-m",
        "tests.harness.probes.racing_reap",
        mode,
        ",".join(hide),
        "--",
    ]
    argv += [*lab_flags(lab, state), "--json", *flags]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@contextlib.contextmanager
def seeded_lab() -> Iterator[tuple[Lab, str, str, str]]:
    """A lab whose runtime keeps both seed sandboxes (NOTREADY, nothing running inside) beside a
    live pod started first: (lab, chained sandbox, CNI-not-configured sandbox, live pod). The
    node tests' `seeds` fixture makes the same on the module's lab."""
    with Lab() as lab:
        web = lab.run_pod("web")
        chained, nocni = reproduce_both_seeds(lab)
        yield lab, chained, nocni, web


def reproduce_both_seeds(lab: Lab) -> tuple[str, str]:
    """Both seed reports on the lab's runtime: a chained list whose last plugin fails ADD, and
    a pod started while CNI is not configured. Their sandbox IDs; the network is normal after."""
    lab.set_network("failing")
    chained = lab.try_run_pod("chained")
    lab.set_network("empty")
    nocni = lab.try_run_pod("nocni")
    lab.set_network("normal")
    assert chained.sandbox_id is not None and nocni.sandbox_id is not None
    return chained.sandbox_id, nocni.sandbox_id
