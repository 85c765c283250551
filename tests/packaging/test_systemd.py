"""The systemd units: `systemd-analyze verify` clean, hardening that leaves reaping possible, a
unit that reports only and a drop-in that makes it reap (reclaiming is chosen only that way), and
a README whose install blocks put everything where the units look.

The units are copied to a temporary dir with ExecStart pointed at a stub (verify insists that the
binary exists); nothing is installed or started. tests/node/test_systemd_boot.py runs the README's
blocks in a booted systemd.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.readme import README, blocks, shell_block

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SERVICE = UNITS / "cni-reaper.service"
TIMER = UNITS / "cni-reaper.timer"
REAP = UNITS / "cni-reaper.service.d" / "reap.conf"
VENV = "/opt/cni-reaper"  # the README's install
BINARY = f"{VENV}/bin/reaper"
TEXTFILE = "/var/lib/node_exporter/textfile_collector/cni_reaper.prom"

# Each of these gives the service its own mount namespace, where systemd turns every mount into
# a slave: an unmounted netns pin would stay mounted on the host. PrivateNetwork hides the host's
# links and chains; PrivateUsers, User and DynamicUser take the capabilities away.
FORBIDDEN = {
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "PrivateNetwork",
    "PrivateUsers",
    "PrivateIPC",
    "ProtectSystem",
    "ProtectHome",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "ReadOnlyPaths",
    "ReadWritePaths",
    "InaccessiblePaths",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "RootDirectory",
    "RootImage",
    "MountFlags",
    "NetworkNamespacePath",
    "User",
    "DynamicUser",
}


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as (key, value) lists; keys may repeat, as systemd allows."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: {line!r} outside a section"
        assert not line.endswith("\\"), f"{path.name}: keep {line!r} on one line"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not key=value"
        current.append((key.strip(), value.strip()))
    return sections


def values(section: list[tuple[str, str]], key: str) -> list[str]:
    return [v for k, v in section if k == key]


@pytest.fixture
def verify_dir(tmp_path: Path) -> Path:
    stub = tmp_path / "reaper"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    service = SERVICE.read_text()
    assert BINARY in service
    (tmp_path / SERVICE.name).write_text(service.replace(BINARY, str(stub)))
    shutil.copy(TIMER, tmp_path / TIMER.name)
    # verify reads a unit's drop-ins from <unit>.d beside it, as systemd does.
    dropins = tmp_path / f"{SERVICE.name}.d"
    dropins.mkdir()
    reap = REAP.read_text()
    assert BINARY in reap
    (dropins / REAP.name).write_text(reap.replace(BINARY, str(stub)))
    return tmp_path


def test_systemd_analyze_verify_is_clean(verify_dir: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(verify_dir / SERVICE.name), str(verify_dir / TIMER.name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Verify exits 0 on some problems (an unknown key, a bad value) and only prints them.
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_service_runs_one_report_only_scan_into_the_textfile_collector() -> None:
    service = parse_unit(SERVICE)["Service"]
    assert values(service, "Type") == ["oneshot"]
    (exec_start,) = values(service, "ExecStart")
    argv = shlex.split(exec_start)
    assert argv[:2] == [BINARY, "scan"], "the unit alone never reclaims: reap.conf chooses that"
    assert argv[argv.index("--textfile") + 1] == TEXTFILE
    assert argv[argv.index("--log-format") + 1] == "json"
    # "Orphans found" is the report's job; exit 2 (could not decide) still fails the unit.
    assert values(service, "SuccessExitStatus") == ["1"]
    # The state file's dir (and the lock's) exists before the pass.
    state_dirs = " ".join(values(service, "StateDirectory")).split()
    assert "cni-reaper" in state_dirs
    assert values(service, "TimeoutStartSec"), "a hung pass must not block the timer forever"


# The directory settings systemd makes, chmods and chowns (with all that is in them, to the
# unit's user) before each start; and where each is relative to.
MANAGED_DIRS = {
    "StateDirectory": "/var/lib",
    "CacheDirectory": "/var/cache",
    "LogsDirectory": "/var/log",
    "RuntimeDirectory": "/run",
    "ConfigurationDirectory": "/etc",
}


def test_the_unit_owns_only_its_own_dirs(tmp_path: Path) -> None:
    """systemd chowns a StateDirectory= (and the rest of MANAGED_DIRS) with every file in it to
    the unit's user before each run: only the reaper's own dirs may be named there, never
    node_exporter's textfile dir, which other exporters' files share. That dir is used as it is;
    the README's install makes it only where it is missing, and leaves an existing one and
    another tool's file in it as they are."""
    units = (SERVICE, REAP)
    managed = [
        f"{MANAGED_DIRS[key]}/{name}"
        for unit in units
        for key, value in parse_unit(unit).get("Service", [])
        if key in MANAGED_DIRS
        for name in value.split()
    ]
    assert managed == ["/var/lib/cni-reaper"], managed
    textfile_dir = str(Path(TEXTFILE).parent)
    install = shell_block("systemd-install")
    made = [line for line in install.splitlines() if textfile_dir in line]
    assert [shlex.split(line, comments=True) for line in made] == [["mkdir", "-p", textfile_dir]], made
    # The README's line, run on a textfile dir another tool made, with that tool's file in it.
    other = tmp_path / textfile_dir.lstrip("/")
    other.mkdir(parents=True)
    other.chmod(0o775)
    (other / "node_os.prom").write_text("node_os_info 1\n")
    if os.geteuid() == 0:  # another tool's user, as on a node
        for path in (other, other / "node_os.prom"):
            os.chown(path, 65534, 65534)
    before = [(p.stat().st_uid, p.stat().st_gid, p.stat().st_mode) for p in (other, other / "node_os.prom")]
    line = made[0].replace(textfile_dir, str(other))
    subprocess.run(["sh", "-ec", line], check=True, timeout=30)
    after = [(p.stat().st_uid, p.stat().st_gid, p.stat().st_mode) for p in (other, other / "node_os.prom")]
    assert after == before


def test_hardening_keeps_the_host_namespaces_and_the_needed_capabilities() -> None:
    sections = parse_unit(SERVICE)
    used = {key for section in sections.values() for key, _ in section}
    assert not used & FORBIDDEN, f"these would break reaping: {sorted(used & FORBIDDEN)}"
    service = sections["Service"]
    assert values(service, "NoNewPrivileges") == ["yes"]
    (bounding,) = values(service, "CapabilityBoundingSet")
    caps = set(bounding.split())
    assert not bounding.startswith("~")
    # CAP_SYS_CHROOT: joining a mount namespace no process is in (mntns_install) needs it.
    assert {"CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYS_PTRACE"} <= caps
    (families,) = values(service, "RestrictAddressFamilies")
    assert {"AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6"} <= set(families.split())
    for namespaces in values(service, "RestrictNamespaces"):
        # net: plugins join pod netns; mnt: a pinned mount namespace is joined to be read.
        assert {"net", "mnt"} <= set(namespaces.split()) or namespaces == "no"
    for syscall_filter in values(service, "SystemCallFilter"):
        assert syscall_filter.startswith("~"), "an allow list would need every plugin's syscalls"
        assert "@mount" not in syscall_filter, "umount2 unpins a netns"


def test_timer_every_five_minutes() -> None:
    """Counted from boot, with no Persistent=: systemd reads it only beside OnCalendar= (issue
    35: it was set, and did nothing); OnBootSec= is the pass after a node was off."""
    sections = parse_unit(TIMER)
    timer = dict(sections["Timer"])
    assert timer == {
        "OnBootSec": "5min",
        "OnUnitActiveSec": "5min",
        "RandomizedDelaySec": "60",
    }
    assert values(sections["Install"], "WantedBy") == ["timers.target"]


def test_reap_dropin_reaps_into_the_same_textfile() -> None:
    sections = parse_unit(REAP)
    assert set(sections) == {"Unit", "Service"}
    service = sections["Service"]
    # The empty ExecStart= first: otherwise a oneshot would run the unit's scan too.
    assert values(service, "ExecStart")[0] == ""
    (_, exec_start) = values(service, "ExecStart")
    argv = shlex.split(exec_start)
    assert argv[:2] == [BINARY, "reap"]
    assert argv[argv.index("--textfile") + 1] == TEXTFILE
    assert argv[argv.index("--log-format") + 1] == "json"
    # The empty SuccessExitStatus= drops the unit's 1: orphans left fail a reaping unit.
    assert values(service, "SuccessExitStatus") == [""]
    # Only the command and its exit status change: the unit's hardening and dirs apply as they are.
    assert {key for key, _ in service} == {"ExecStart", "SuccessExitStatus"}


def test_readme_blocks_install_what_the_units_run_and_uninstall_it() -> None:
    named = blocks(README.read_text())
    assert {"systemd-install", "systemd-enable", "systemd-reap", "systemd-uninstall"} <= set(named)
    assert "systemd-report-only" not in named, "report-only is the unit's own: no step makes it so"
    install = shell_block("systemd-install")
    # A venv, not the system Python (PEP 668 refuses that on Debian 12 and Ubuntu 24.04).
    assert f"python3 -m venv {VENV}\n" in install
    # The dependencies from the lock, hashes required; the reaper itself built without fetching.
    assert (
        f"{VENV}/bin/pip install --require-hashes -r requirements/runtime.lock -r requirements/build.lock\n" in install
    )
    assert f"{VENV}/bin/pip install --no-deps --no-build-isolation .\n" in install
    assert not [line for line in install.splitlines() if line.split()[:1] in (["pip"], ["pip3"])]
    assert "python3 -m pip" not in install
    # Every file the blocks copy exists in the checkout.
    copied = [
        word
        for name in ("systemd-install", "systemd-reap")
        for line in shell_block(name).splitlines()
        if line.startswith("cp ")
        for word in shlex.split(line, comments=True)[1:-1]
    ]
    assert copied and all((ROOT / path).is_file() for path in copied), copied
    assert {str(p.relative_to(ROOT)) for p in (SERVICE, TIMER, REAP)} == set(copied)
    assert "systemctl enable --now cni-reaper.timer" in shell_block("systemd-enable")
    # The install copies the unit and the timer only: what it runs reclaims nothing.
    assert REAP.name not in shell_block("systemd-install") + shell_block("systemd-enable")
    # The switch to reaping installs the reap drop-in where systemd reads the unit's drop-ins.
    reap = shell_block("systemd-reap")
    assert f"{REAP.relative_to(ROOT)} /etc/systemd/system/cni-reaper.service.d/" in reap
    assert "systemctl daemon-reload" in reap
    uninstall = shell_block("systemd-uninstall")
    for gone in (VENV, "/usr/local/sbin/reaper", "/etc/systemd/system/cni-reaper.service.d", TEXTFILE):
        assert gone in uninstall, gone
    # The textfile dir is node_exporter's: the uninstall removes the reaper's file from it, never it.
    assert f"rm -rf {Path(TEXTFILE).parent}" not in uninstall
