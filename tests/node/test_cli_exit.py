"""The `reaper` command itself: its exit status and whole output, a reader that goes away early
is no traceback, and `--version` says which release it is."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def scan_argv(tmp: Path) -> list[str]:
    for sub in ("net.d", "networks", "cni", "netns", "bin"):
        (tmp / sub).mkdir(exist_ok=True)
    d = str(tmp)
    return ["unshare", "--net", "--", sys.executable, "-m", "reaper", "scan", "--json",
            "--cni-conf-dir", f"{d}/net.d", "--ipam-dir", f"{d}/networks", "--cni-cache-dir", f"{d}/cni",
            "--netns-dir", f"{d}/netns", "--cni-bin-dir", f"{d}/bin", "--runtime-endpoint", f"unix://{d}/none.sock",
            "--state-file", f"{d}/state.json"]  # fmt: skip


def test_the_exit_status_and_the_whole_output(tmp_path: Path) -> None:
    proc = subprocess.run(scan_argv(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2  # no runtime: undecided
    assert proc.stdout.rstrip().endswith("}") and '"summary"' in proc.stdout  # flushed whole
    assert "cannot decide: runtime unreachable" in proc.stderr
    assert (tmp_path / "state.json").exists()


def test_a_reader_that_goes_away_is_no_traceback(tmp_path: Path) -> None:
    reaper = subprocess.Popen(scan_argv(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reaper.stdout is not None and reaper.stderr is not None
    reaper.stdout.close()  # as `| head -c 0` would: gone before the report is written
    stderr = reaper.stderr.read().decode()
    assert reaper.wait(timeout=60) == 2
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


def test_version_is_the_packages() -> None:
    proc = subprocess.run([sys.executable, "-m", "reaper", "--version"], capture_output=True, text=True, check=False)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"reaper {version}\n", "")


def listen_argv(tmp: Path, listen: str) -> list[str]:
    """`reaper run` in a network namespace of its own with only its loopback up: no address
    but 127.0.0.1 and ::1 is this namespace's, and no name resolves."""
    argv = scan_argv(tmp)
    at = argv.index("scan")
    reaper = [*argv[argv.index(sys.executable) : at], "run", *argv[at + 2 :]]  # no --json for run
    return ["unshare", "--net", "--", "sh", "-ec", 'ip link set lo up; exec "$@"', "sh",
            *reaper, "--mode", "scan", "--events", "off", "--listen", listen]  # fmt: skip


@pytest.mark.parametrize(
    ("listen", "said"),
    [
        ("192.0.2.1:9753", "Cannot assign requested address (EADDRNOTAVAIL); HOST is not an address of this node"),
        ("no-such-host.invalid:9753", "; HOST is neither an IP address nor a name this node resolves"),
    ],
)
def test_a_listen_address_the_node_cannot_take_is_one_line(tmp_path: Path, listen: str, said: str) -> None:
    """Issue 35: an unassignable --listen is one line naming --listen, the OS's error and the
    fix, exit 2; the agent makes no pass first."""
    proc = subprocess.run(listen_argv(tmp_path, listen), capture_output=True, text=True, timeout=60, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("reaper:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"reaper: --listen {listen}: cannot listen: "), proc.stderr
    assert said in lines[0], proc.stderr
    assert not (tmp_path / "state.json").exists(), "no pass before the endpoints listen"


def test_a_user_who_cannot_see_the_hosts_netns_gets_one_line(tmp_path: Path) -> None:
    """Issue 35: run as a user other than root, a scan was an OSError traceback (the host's
    netns cannot be told: /proc/1/ns/net is not that user's to stat). Now one line, exit 2."""
    argv = scan_argv(tmp_path)
    reaper = argv[argv.index(sys.executable) :]
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *reaper]
    proc = subprocess.run(as_nobody, capture_output=True, text=True, timeout=120, check=False, cwd="/")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "reaper: cannot tell the host's network namespace (/proc/1/ns/net: Permission denied): run as root, "
        "in the host's PID namespace (hostPID), with its /proc"
    ), proc.stderr
