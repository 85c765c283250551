"""What the lab tests of delegating plugins share: a stand-in installed in the lab's bin dir,
a dead attachment with kernel evidence and the per-container file a stand-in will read, every
resource of a live pod, and files outside the CNI dirs a forged delegate would take."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.reap_helpers import cached_result, filter_lines, firewall_rules_of, host_links, nat_chains

HARNESS = Path(__file__).resolve().parent


def install_standin(lab: Lab, plugin: str) -> Path:
    """tests/harness/<plugin>_standin.py as the lab's `plugin`; the log of its runs."""
    target = lab.bin_dir / plugin
    shutil.copyfile(HARNESS / f"{plugin}_standin.py", target)
    target.chmod(0o755)
    return Path(f"{target}.log")


def standin_runs(log: Path, container_id: str) -> list[dict[str, Any]]:
    """What a stand-in logged of its DELs for this container."""
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line for line in lines if line["container_id"] == container_id]


def add_firewall(lab: Lab, pod: str) -> None:
    """The firewall plugin's ADD for a live pod, as a chained list would run it: its rules are
    what a forged prevResult would make a firewall DEL remove."""
    netns = lab.pod_netns_path(pod)
    assert netns is not None
    call = labcni.PluginCall("ADD", pod, str(netns), "eth0", (), lab.bin_dir, lab.netns_path)
    conf = {"type": "firewall", "name": lab.network_name, "cniVersion": "1.0.0", "prevResult": cached_result(lab, pod)}
    labcni.exec_plugin(call, conf)


@dataclass(frozen=True)
class DeadAttachment:
    """An attachment of a container no runtime knows, with kernel evidence: a real pin and a
    veth whose peer is in it, its libcni cache entry (the conf dir's config of `network`) and
    the per-container file a delegating plugin's DEL reads."""

    container_id: str
    pin: Path
    veth: str
    cache: Path
    scratch: Path


def make_dead(
    lab: Lab, *, container_id: str, network: str, config: bytes, scratch: Path, data: bytes
) -> DeadAttachment:
    pin = lab.make_pin()
    veth = f"vethd{container_id[:8]}"
    lab.run_in_netns(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(pin)], check=True)
    result = {"cniVersion": "1.0.0", "interfaces": [{"name": veth}, {"name": "eth0", "sandbox": str(pin)}]}
    entry = labcni.cache_entry(
        container_id=container_id,
        network=network,
        ifname="eth0",
        conflist=config,
        cni_args=(("IgnoreUnknown", "1"),),
        capability_args={},
        result=result,
    )
    cache = labcni.write_cache_entry(lab.cache_dir, {**entry, "netns": str(pin)})
    scratch.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    scratch.write_bytes(data)
    scratch.chmod(0o600)
    return DeadAttachment(container_id, pin, veth, cache, scratch)


def dead_left(lab: Lab, dead: DeadAttachment) -> list[str]:
    """What of the dead attachment is still on the node."""
    left = [str(p) for p in (dead.pin, dead.cache, dead.scratch) if p.exists()]
    return left + ([dead.veth] if dead.veth in host_links(lab) else [])


def live_resources(lab: Lab, pod: str) -> dict[str, object]:
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


def outside_victims(directory: Path, container_id: str) -> dict[Path, bytes]:
    """Files outside every CNI dir that host-local's release would take for this container
    (content its ID, alone or with the ifname, in a dir named like a network): path -> bytes."""
    victims = {
        directory / "victim-net" / "10.9.9.9": container_id.encode(),
        directory / "victim-net" / "10.9.9.8": f"{container_id}\r\neth0".encode(),
    }
    for path, data in victims.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return victims


def forged_host_local(name: str, data_dir: Path) -> dict[str, Any]:
    """host-local as a plugin config of its own, its IPAM dir wherever the forger likes."""
    ipam = {"type": "host-local", "dataDir": str(data_dir), "ranges": [[{"subnet": "10.9.9.0/24"}]]}
    return {"cniVersion": "1.0.0", "name": name, "type": "host-local", "ipam": ipam}
