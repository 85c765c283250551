"""A lease stays while the namespace that holds its address stays (issue 31, point 9).

antrea#8239 is a GC that released host-local leases of a pod still running, and host-local
then gave the address to a second pod. The reaper has its own way to that harm: it keeps an
orphan's netns pin on purpose (a chain with a plugin that keeps state elsewhere, whose DEL did
not run or failed), and the kernel step freed the lease anyway, while the address was still
configured on `eth0` in the kept pin.

Real parts: a pin made by the real bridge and host-local plugins, so its `eth0` holds the only
address of a one-address range (10.1.x.3), a host veth, the lease file, the libcni cache entry,
and a chained plugin with a datastore of its own (`reaper-stateful-noop`, below), the real
`reaper reap` in the lab's netns. The check of what is harmed is host-local's own: an ADD for a
new container gets that address only if the reaper freed its lease.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lab import Lab
from tests.harness.lab import cni as labcni
from tests.harness.plugins import script, stateful_noop
from tests.harness.reap_helpers import REAP
from tests.harness.reaper_cli import ReaperRun, run_reaper

PLUGIN = "reaper-stateful-noop"


@pytest.fixture(scope="module", autouse=True)
def stateful_noop_installed(lab: Lab) -> None:
    """The chained plugin in the lab's bin dir, for every test here."""
    lab.install_plugin(PLUGIN, script(stateful_noop))


@dataclass
class Network:
    name: str
    conflist: dict[str, Any]
    address: str  # the only address of its range
    bridge: str


@contextlib.contextmanager
def one_address_network(lab: Lab, third: int) -> Iterator[Network]:
    """A bridge + host-local network whose range holds one address, 10.1.<third>.3, chained
    with the stateful plugin; its conflist and bridge removed after it."""
    name, bridge = f"keep-{secrets.token_hex(3)}", f"kp{secrets.token_hex(3)}"
    address = f"10.1.{third}.3"
    bridge_plugin = {
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": f"10.1.{third}.0/24", "rangeStart": address, "rangeEnd": address}]],
            "dataDir": str(lab.ipam_dir),
        },
    }
    conflist: dict[str, Any] = {"cniVersion": "1.0.0", "name": name, "plugins": [bridge_plugin, {"type": PLUGIN}]}
    conf = lab.conf_dir / f"30-{name}.conflist"
    conf.write_text(json.dumps(conflist))
    try:
        yield Network(name, conflist, address, bridge)
    finally:
        conf.unlink()
        lab.run_in_netns(["ip", "link", "del", bridge])


@dataclass
class Attached:
    container_id: str
    pin: Path
    cache: Path
    lease: Path


def attach(lab: Lab, net: Network) -> Attached:
    """ADD the network for a container ID the runtime never saw, as containerd would, with its
    cache entry."""
    cid = secrets.token_hex(32)
    pin = lab.make_pin()
    call = lab.plugin_call(cid, pin)
    result, cache = labcni.add_and_cache(lab.cache_dir, net.conflist, call)
    assert labcni.result_ip(result) == net.address
    attached = Attached(cid, pin, cache, lab.ipam_dir / net.name / net.address)
    assert configured_in(lab, pin) == {net.address} and attached.lease.exists()
    return attached


def configured_in(lab: Lab, pin: Path) -> set[str]:
    """The IPv4 addresses configured on eth0 in the namespace pinned at `pin`."""
    out = lab.run_in_netns(["nsenter", f"--net={pin}", "ip", "-j", "-4", "addr", "show", "dev", "eth0"])
    if out.returncode != 0:
        return set()
    return {a["local"] for link in json.loads(out.stdout) for a in link.get("addr_info", ())}


def reap(lab: Lab, tmp_path: Path, *flags: str) -> ReaperRun:
    return run_reaper(lab, "reap", tmp_path / f"state-{secrets.token_hex(3)}.json", "--json", *REAP, *flags)


def resources_of(run: ReaperRun, cid: str) -> dict[str, dict[str, Any]]:
    (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == cid]
    return {r["kind"]: r for r in outcome["resources"]}


def another_pod_gets(lab: Lab, net: Network) -> str | None:
    """What host-local gives a new container on the network: its address, or None when the
    range has none free. The new container's ADD is undone at once."""
    cid, pin = secrets.token_hex(32), lab.make_pin()
    try:
        try:
            result = labcni.add_network_list(net.conflist, lab.plugin_call(cid, pin), {})
        except labcni.PluginError as err:
            assert "no IP addresses available" in str(err), err
            return None
        labcni.del_network_list(net.conflist, lab.plugin_call(cid, pin, "DEL"), {}, result)
        return labcni.result_ip(result)
    finally:
        subprocess.run(["umount", str(pin)], check=True)
        pin.unlink()


@contextlib.contextmanager
def del_fails(lab: Lab) -> Iterator[None]:
    """Every DEL of the chain fails: the stateful plugin's (its flag) and the bridge plugin's,
    which then frees neither the lease nor `eth0` (a script in its place that fails DEL and
    runs the real one for every other verb)."""
    flag, bridge = lab.bin_dir / "fail-del", lab.bin_dir / "bridge"
    real = bridge.resolve()
    flag.touch()
    bridge.unlink()
    bridge.write_text(
        "#!/bin/sh\n"
        'if [ "$CNI_COMMAND" = DEL ]; then\n'
        '  echo \'{"cniVersion":"1.0.0","code":11,"msg":"bridge DEL failed"}\'; exit 1\n'
        "fi\n"
        f'exec {real} "$@"\n'
    )
    bridge.chmod(0o755)
    try:
        yield
    finally:
        flag.unlink()
        bridge.unlink()
        bridge.symlink_to(real)


def assert_kept_with_its_pin(lab: Lab, net: Network, leak: Attached, run: ReaperRun) -> None:
    """The pin, the address in it and the lease all stay, the lease reported kept and why."""
    assert leak.pin.exists() and leak.cache.exists()
    assert configured_in(lab, leak.pin) == {net.address}
    assert leak.lease.exists(), "the lease was freed while its address is configured in the kept pin"
    found = resources_of(run, leak.container_id)
    assert not found["netns"]["ok"] and not found["ipam"]["ok"]
    why = str(found["ipam"]["error"])
    assert why.startswith("kept:") and leak.pin.name in why, why
    assert another_pod_gets(lab, net) is None, "host-local handed the kept pin's address to a new pod"


def test_method_kernel_keeps_the_lease_with_the_pin_it_keeps(lab: Lab, tmp_path: Path) -> None:
    with one_address_network(lab, 2) as network:
        kernel_step_keeps_it(lab, network, tmp_path)


def kernel_step_keeps_it(lab: Lab, network: Network, tmp_path: Path) -> None:
    leak = attach(lab, network)
    run = reap(lab, tmp_path, "--method", "kernel")
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr
    (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == leak.container_id]
    assert outcome["needs_plugin"] == PLUGIN
    assert_kept_with_its_pin(lab, network, leak, run)
    # A pass whose DEL succeeds frees it all, the lease by the plugins' own DEL.
    run = reap(lab, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert not leak.pin.exists() and not leak.cache.exists() and not leak.lease.exists()
    assert another_pod_gets(lab, network) == network.address


def test_a_failed_del_keeps_the_lease_with_the_pin(lab: Lab, tmp_path: Path) -> None:
    with one_address_network(lab, 3) as network:
        failed_del_keeps_it(lab, network, tmp_path)


def failed_del_keeps_it(lab: Lab, network: Network, tmp_path: Path) -> None:
    leak = attach(lab, network)
    with del_fails(lab):
        run = reap(lab, tmp_path)
        assert run.returncode == 1, run.stdout[-2000:] + run.stderr
        (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == leak.container_id]
        assert outcome["needs_plugin"] == PLUGIN
        errors = " ".join(outcome["plugin_errors"])
        assert "datastore unavailable" in errors and "bridge DEL failed" in errors
        assert_kept_with_its_pin(lab, network, leak, run)
    run = reap(lab, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert not leak.pin.exists() and not leak.cache.exists() and not leak.lease.exists()
    assert another_pod_gets(lab, network) == network.address
