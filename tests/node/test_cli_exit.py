"""The `reaper` command itself: its exit status and whole output, a reader that goes away early
is no traceback, and `--version` says which release it is."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

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
