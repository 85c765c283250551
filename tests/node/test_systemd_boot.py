"""The README's systemd install under a real systemd: systemd-nspawn boots a stock debootstrap
bookworm (systemd and the tools, nothing of the reaper's) in the lab's netns, with the lab's dir
bound in at the same path (its runtime socket, netns pins, IPAM, cache, config and bin dirs), and
a copy of this checkout at /root/cni-reaper. There the README's blocks run as written, taken from
README.md (tests/harness/readme.py), from the checkout as an operator would:
  - systemd-install, systemd-enable: the venv under /opt/cni-reaper, the units, the timer on.
    The timer fires; the unit's report-only scan succeeds (exit 1 for the orphan it finds, which
    the unit counts as success), writes the textfile and the state file, and reclaims nothing;
  - systemd-reap: the reap drop-in goes in; a pass now reaps, and frees what it may;
  - systemd-uninstall: no unit, venv, link, textfile or state is left.
node_exporter's textfile dir is there before the install, another tool's, with that tool's file
in it: after both runs the dir and the file keep their owner and mode (the unit owns only its own
dir).
The node has no package index: pip there reads a wheelhouse of bookworm's wheels for the
project's requirements (tests/harness/nspawn.py), as a site's mirror would stand in for PyPI.

Two things of nspawn's keep a pin from being freed in its container, whatever the unit says:
  - the container has a PID namespace of its own, so a reap pass there calls no netns an
    orphan (the processes that may hold one are out of sight) and says so;
  - nspawn keeps the host's mount tree, copied, hidden under the container's root, so after
    the pin is unmounted in the container its unlink fails with EBUSY (a mount point in the
    caller's own mount namespace); the host's mount is a master the container cannot unmount.
A mount namespace with no process in it, pinned on a file in the container and holding a netns of
the lab (bound on a file there), is made after the boot: the timer's first scan reads it through
a child that joins it (the unit must let it: CAP_SYS_CHROOT, RestrictNamespaces=mnt), so that
netns is reported held, by a mount with no process in it, and the mount walk does not fail.

What the unit's hardening decides is whether the unmount happens in the mount namespace the pins
are in. The reaper's own unpin code (tests/harness/probes/unpin.py), run as the ExecStart of a
copy of the shipped service with all its hardening, shows that it does: the pin's mount is gone
from the container's mount table, and the unlink is the only step left, for nspawn's reason (the
same code run in the container outside any unit stops at the same step).

Only what a test cannot wait for is changed, in drop-ins put in place before the boot: the
timer's first run comes 2 s after boot instead of 5 minutes, and the service's environment
points the reaper at the lab and drops the grace (min-age, confirmations, breaker ratio) a node
would keep. The second pass (after the switch to reap) is started by hand rather than waiting
the timer's 5 minutes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.agent import metric
from tests.harness.lab import Lab, PortMap
from tests.harness.nspawn import VENV, BootedNode, copy_checkout
from tests.harness.readme import shell_block
from tests.harness.reap_helpers import SCAN, pings
from tests.harness.reaper_cli import attachments_by_key, run_reaper

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SYSTEM_CNI_BIN = Path("/usr/lib/cni")  # where the lab's bin dir links point
TEXTFILE = "var/lib/node_exporter/textfile_collector/cni_reaper.prom"
STATE = "var/lib/cni-reaper/state.json"
NSPAWN_RUN = Path("/run/systemd/nspawn")  # nspawn's own dirs on the host, made at its first run
UNPIN_PROBE = ROOT / "tests" / "harness" / "probes" / "unpin.py"
UNPIN_AT = "/usr/local/lib/cni-reaper-test/unpin.py"
CHECKOUT = "/root/cni-reaper"  # where the README's commands run, as from a clone
# What the README's install makes on the node, that its uninstall must remove.
INSTALLED = (
    VENV,
    "/usr/local/sbin/reaper",
    "/etc/systemd/system/cni-reaper.service",
    "/etc/systemd/system/cni-reaper.timer",
    "/etc/systemd/system/cni-reaper.service.d",
    "/" + TEXTFILE,
    "/var/lib/cni-reaper",
)
# node_exporter's textfile dir as another tool made it, with another exporter's file in it: the
# unit must use it as it is (a StateDirectory= there had systemd chown both to root).
OTHER_TOOL = 65534
OTHER_PROM = "var/lib/node_exporter/textfile_collector/node_os.prom"
# The service's properties a run is judged by.
PROPS = ("ActiveState", "Result", "ExecMainStatus", "ExecMainExitTimestampMonotonic", "InvocationID", "ExecStart")

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-nspawn") is None or shutil.which("debootstrap") is None,
    reason="needs systemd-nspawn (systemd-container) and debootstrap (make deps)",
)


@pytest.fixture
def nspawn_run_dir() -> Iterator[None]:
    """systemd-nspawn makes /run/systemd/nspawn/{locks,propagate} on the host; if the machine had
    none before, none is left after (empty dirs only: another container's files stay)."""
    existed = NSPAWN_RUN.exists()
    yield
    if not existed and NSPAWN_RUN.is_dir():
        for path in sorted(NSPAWN_RUN.rglob("*"), key=lambda p: -len(p.parts)):
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        if not any(NSPAWN_RUN.iterdir()):
            NSPAWN_RUN.rmdir()


def unpin_unit(netns_dir: Path, pin: str) -> str:
    """The shipped service with only its ExecStart swapped for the unpin probe."""
    lines = (UNITS / "cni-reaper.service").read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("ExecStart=")]
    lines[at] = f"ExecStart={VENV}/bin/python {UNPIN_AT} {netns_dir} {pin}"
    return "\n".join(lines) + "\n"


def prepare_node(node: BootedNode, lab: Lab, pin: str) -> None:
    """What the node holds before its boot besides the stock tree: the checkout the README's
    commands run from, the test's drop-ins (the timer soon, the service pointed at the lab), and
    the unpin check's probe and unit. Nothing of the reaper is installed."""
    copy_checkout(node.upper / CHECKOUT.lstrip("/"))
    system = node.upper / "etc" / "systemd" / "system"
    probe = node.upper / UNPIN_AT.lstrip("/")
    probe.parent.mkdir(parents=True)
    shutil.copy(UNPIN_PROBE, probe)
    system.mkdir(parents=True)
    (system / "cni-reaper-unpin.service").write_text(unpin_unit(lab.netns_dir, pin))
    # Started by the README's `enable --now` long after boot, the timer fires at once.
    (system / "cni-reaper.timer.d").mkdir()
    (system / "cni-reaper.timer.d" / "soon.conf").write_text(
        "[Timer]\nOnBootSec=\nOnBootSec=2s\nOnUnitActiveSec=5min\nRandomizedDelaySec=0\nAccuracySec=1s\n"
    )
    other = node.upper / OTHER_PROM
    other.parent.mkdir(parents=True)
    other.write_text("node_os_info 1\n")
    for path in (other.parent, other):
        os.chown(path, OTHER_TOOL, OTHER_TOOL)
    other.parent.chmod(0o775)
    env = {
        "REAPER_RUNTIME_ENDPOINT": lab.endpoint,
        "REAPER_NETNS_DIR": str(lab.netns_dir),
        "REAPER_IPAM_DIR": str(lab.ipam_dir),
        "REAPER_CNI_CACHE_DIR": str(lab.cache_dir),
        "REAPER_CNI_CONF_DIR": str(lab.conf_dir),
        "REAPER_CNI_BIN_DIR": str(lab.bin_dir),
        "REAPER_MIN_AGE": "0",
        "REAPER_CONFIRMATIONS": "1",
        "REAPER_MAX_ORPHAN_RATIO": "1",
    }
    # Beside where the README puts reap.conf; its uninstall removes this dir whole.
    (system / "cni-reaper.service.d").mkdir()
    (system / "cni-reaper.service.d" / "lab.conf").write_text(
        "[Service]\n" + "".join(f"Environment={k}={v}\n" for k, v in env.items())
    )


# In the container: a mount namespace with no process in it, pinned on /run/held-mnt-pin, in which
# the netns pinned at $1 is bound on /run/held-net. Made again until the kernel takes the bind (it
# binds a mount namespace only above the binder's own id). Prints the namespace's inode.
PIN_MOUNT_NAMESPACE = """
touch /run/held-mnt-pin /run/held-net
me=$(readlink /proc/self/ns/mnt)
tries=0
while :; do
  unshare --mount --propagation private sleep 600 &
  x=$!
  while [ "$(readlink /proc/$x/ns/mnt)" = "$me" ]; do sleep 0.01; done
  if mount --bind /proc/$x/ns/mnt /run/held-mnt-pin 2>/dev/null; then break; fi
  kill $x; wait $x || true
  tries=$((tries+1)); [ $tries -lt 2000 ]
done
nsenter --mount=/run/held-mnt-pin mount --bind "$HELD" /run/held-net
kill $x; wait $x || true
stat -L -c %i /run/held-mnt-pin
"""


def pin_mount_namespace(node: BootedNode, held: Path) -> int:
    """PIN_MOUNT_NAMESPACE run in the container; the pinned namespace's inode."""
    run = node.sh(f"HELD={held}\n{PIN_MOUNT_NAMESPACE}")
    assert run.returncode == 0, run.stdout + run.stderr
    return int(run.stdout.split()[-1])


def readme(node: BootedNode, *names: str) -> str:
    """The README's blocks `names`, run in order from the checkout; their output."""
    script = "".join(shell_block(name) for name in names)
    run = node.sh(script, cwd=CHECKOUT)
    assert run.returncode == 0, f"README blocks {names} failed:\n{(run.stdout + run.stderr)[-4000:]}"
    return run.stdout + run.stderr


def existing(node: BootedNode, paths: tuple[str, ...]) -> list[str]:
    """The paths of `paths` that exist in the container."""
    return [path for path in paths if node.run("test", "-e", path, check=False).returncode == 0]


def journal_of(node: BootedNode, invocation: str) -> str:
    return node.run("journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}").stdout


def owners(path: Path) -> list[tuple[int, int, int]]:
    """Owner, group and mode of the dir `path` is in, and of `path`."""
    return [(p.stat().st_uid, p.stat().st_gid, p.stat().st_mode) for p in (path.parent, path)]


def live_attachments(lab: Lab, state: Path) -> dict[tuple[str | None, str | None, str | None], list[str]]:
    run = run_reaper(lab, "scan", state, "--json", *SCAN)
    assert run.returncode in (0, 1), run.stderr
    return {
        key: sorted(f"{r['kind']} {r['name']}" for r in a["resources"])
        for key, a in attachments_by_key(run.doc).items()
        if a["verdict"] == "live"
    }


def wait_for_run(node: BootedNode, timeout: float = 90) -> dict[str, str]:
    """The service's properties once its first run has ended."""
    deadline = time.monotonic() + timeout
    props: dict[str, str] = {}
    while time.monotonic() < deadline:
        props = node.show("cni-reaper.service", *PROPS)
        if props.get("ExecMainExitTimestampMonotonic", "0") != "0" and props.get("ActiveState") != "activating":
            return props
        time.sleep(0.5)
    journal = node.run("journalctl", "--no-pager", "-n", "80", check=False).stdout
    raise AssertionError(f"cni-reaper.service never ran: {props}\n{journal}")


@pytest.mark.usefixtures("nspawn_run_dir")
def test_the_readme_install_report_only_reap_and_uninstall(tmp_path: Path) -> None:
    with Lab() as lab:
        web = lab.run_pod("web", port_mappings=[PortMap(8080, 80)])
        leak = lab.make_leak(with_cache=False)
        pin = str(leak.netns_path)
        bare_pin = lab.make_pin()  # unpinned outside any unit, for comparison
        held_pin = lab.make_pin()  # held in the container by a mount namespace no process is in
        # A cache file a crash cut to nothing, of a container no runtime knows: it holds no
        # address, so the pass may free it though the unit cannot see every namespace.
        cut = lab.cache_dir / "results" / f"{lab.network_name}-{secrets.token_hex(32)}-eth0"
        cut.write_bytes(b"")
        live = live_attachments(lab, tmp_path / "before.json")
        assert len(live) == 2

        node = BootedNode(tmp_path / "node", lab.netns_path, binds=[lab.root], ro_binds=[SYSTEM_CNI_BIN])
        prepare_node(node, lab, leak.netns_path.name)
        textfile, state = node.upper / TEXTFILE, node.upper / STATE
        other_before = owners(node.upper / OTHER_PROM)
        try:
            node.boot()
            stock = node.run("sh", "-c", f"test ! -e {VENV} && ! command -v reaper", check=False).returncode == 0
            pinned_mnt = pin_mount_namespace(node, held_pin)

            # Report only: the README's install and the timer, as written; nothing chooses reap.
            readme(node, "systemd-install", "systemd-enable")
            enabled = node.run("systemctl", "is-enabled", "cni-reaper.timer").stdout.strip()
            scan = wait_for_run(node)
            timer = node.show("cni-reaper.timer", "ActiveState", "LastTriggerUSecMonotonic")
            scan_journal = journal_of(node, scan["InvocationID"])
            scan_body = textfile.read_text()
            cut_after_scan, state_after_scan = cut.exists(), state.exists()
            on_path = node.sh("command -v reaper && reaper --version").stdout.split()

            # Reap: the README's switch, then a pass now rather than in 5 minutes.
            readme(node, "systemd-reap")
            node.run("systemctl", "start", "cni-reaper.service", check=False, timeout=600)
            service = node.show("cni-reaper.service", *PROPS)
            journal = journal_of(node, service["InvocationID"])
            applied = node.show("cni-reaper.service", "NoNewPrivileges", "CapabilityBoundingSet", "RestrictNamespaces")
            body = textfile.read_text()
            textfile_mode = stat.S_IMODE(textfile.stat().st_mode)
            state_mode, state_doc = stat.S_IMODE(state.stat().st_mode), json.loads(state.read_text())
            other_after = owners(node.upper / OTHER_PROM)

            mounted_before = pin in node.run("cat", "/proc/self/mountinfo").stdout
            node.run("systemctl", "start", "cni-reaper-unpin.service", check=False)
            unpin_log = node.run("journalctl", "--no-pager", "-o", "cat", "-u", "cni-reaper-unpin.service").stdout
            mounted_after = pin in node.run("cat", "/proc/self/mountinfo").stdout
            # The same code with no unit around it: no hardening at all.
            direct = node.run(f"{VENV}/bin/python", UNPIN_AT, str(lab.netns_dir), bare_pin.name, check=False).stdout

            # Uninstall, as written; then nothing of the README's install is left.
            installed = existing(node, INSTALLED)
            readme(node, "systemd-uninstall")
            left = existing(node, INSTALLED)
            units_after = {
                unit: node.show(unit, "LoadState")["LoadState"] for unit in ("cni-reaper.service", "cni-reaper.timer")
            }
            timers_after = node.run("systemctl", "list-timers", "--all", "--no-legend").stdout
        finally:
            assert node.poweroff() == 0, node.log.read_text()[-2000:]

        assert stock, "the node had a reaper before the README's install"
        assert enabled == "enabled"
        assert on_path[0] == "/usr/local/sbin/reaper" and len(on_path) > 1, on_path

        # The timer fired the report-only service: a scan that found the orphan (exit 1, which
        # the unit counts as success), wrote the textfile, and reclaimed nothing.
        assert timer["ActiveState"] == "active"
        assert timer["LastTriggerUSecMonotonic"] not in ("", "0"), timer
        assert f"argv[]={VENV}/bin/reaper scan --textfile /{TEXTFILE} " in scan["ExecStart"], scan["ExecStart"]
        assert (scan["Result"], scan["ExecMainStatus"]) == ("success", "1"), (scan, scan_journal[-3000:])
        assert metric(scan_body, "cni_reaper_runtime_up") == 1
        assert metric(scan_body, "cni_reaper_attachments", verdict="orphan") >= 1
        # Report-only: its build_info says so, and it has no reclaim counter to show.
        assert "cni_reaper_reclaimed_total{" not in scan_body
        assert re.search(r'^cni_reaper_build_info\{[^}]*mode="scan"[^}]*\} 1\.0$', scan_body, re.MULTILINE)
        assert cut_after_scan and state_after_scan
        # The mount namespace no process is in was read by the timer's one-shot: the netns bound
        # there is held (its attachment live, by that mount), and the mount walk did not fail.
        table = scan_journal.splitlines()
        reasons = [table[i + 1] for i, line in enumerate(table[:-1]) if held_pin.name in line]  # the next line
        held = f"held by a mount at /run/held-net in mount namespace mnt:[{pinned_mnt}] (no process in it"
        assert any(held in reason for reason in reasons), (reasons, scan_journal[-3000:])
        assert "cannot be read" not in scan_journal and '"source": "heldns"' not in scan_journal, scan_journal[-3000:]

        # With the reap drop-in the unit reaps, and the pass succeeded.
        assert f"argv[]={VENV}/bin/reaper reap --textfile /{TEXTFILE} " in service["ExecStart"], service["ExecStart"]
        assert service["Result"] == "success" and service["ExecMainStatus"] == "0", (service, journal[-3000:])
        assert applied["NoNewPrivileges"] == "yes"
        caps = set(applied["CapabilityBoundingSet"].split())
        assert "cap_sys_admin" in caps and "cap_sys_module" not in caps, caps

        # The textfile and the state file, written where the units say. The cut cache file was
        # judged through the runtime's socket and freed from the bound dirs by the kernel step.
        # The leak's lease (an attachment with no netns) is left: the container's PID namespace
        # hides the namespaces a live pod holding its address could be in. Its pin was not
        # judged, for the same reason.
        assert textfile_mode == 0o644
        assert metric(body, "cni_reaper_runtime_up") == 1
        assert metric(body, "cni_reaper_reclaimed_total", kind="cache", method="kernel") == 1
        assert not cut.exists()
        assert count_of(body, "cni_reaper_reclaimed_total", kind="ipam", method="kernel") == 0
        assert count_of(body, "cni_reaper_reclaimed_total", kind="ipam", method="cni-del") == 0
        assert leak.lease_path.exists()
        assert "not every network namespace on the node can be seen" in journal
        assert metric(body, "cni_reaper_attachments", verdict="unknown") >= 1
        assert count_of(body, "cni_reaper_reclaimed_total", kind="netns", method="kernel") == 0
        assert "not in the host's PID namespace" in journal
        assert state_mode == 0o600
        assert state_doc
        # Two runs later, node_exporter's dir and the other exporter's file are as that tool left them.
        assert other_after == other_before and other_before[0][:2] == (OTHER_TOOL, OTHER_TOOL)

        # Under the unit's hardening the reaper's unpin unmounted the pin in the container's own
        # mount namespace (no namespace of the unit's, umount2 allowed); only nspawn's hidden
        # copy of the host's tree kept the unlink from going through.
        (outcome,) = [json.loads(line) for line in unpin_log.splitlines() if line.startswith("{")]
        assert outcome["was_namespace"] is True
        assert mounted_before and not mounted_after, unpin_log
        assert outcome["error"] == "unlink: Device or resource busy", outcome
        # Without the unit the same code gets exactly as far: the unlink is nspawn's limit.
        assert json.loads(direct) == {**outcome, "pin": str(bare_pin)}

        # The uninstall left nothing of the install, and systemd knows neither unit.
        assert installed == list(INSTALLED) and left == [], (installed, left)
        assert units_after == {"cni-reaper.service": "not-found", "cni-reaper.timer": "not-found"}, units_after
        assert "cni-reaper" not in timers_after

        assert live_attachments(lab, tmp_path / "after.json") == live
        assert pings(lab, web)


def count_of(body: str, name: str, **labels: str) -> float:
    """A counter's value; 0 when it is not there (a counter is made only where it can move:
    reaper.metrics)."""
    try:
        return metric(body, name, **labels)
    except AssertionError:
        return 0.0
