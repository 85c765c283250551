"""The `reaper` command itself: it leaves without tearing the interpreter down (reaper.cli.entry),
keeping its exit status, a reader that goes away early is no traceback, the child `scan` forks
at its start is gone however the command ends, and `--version` says which release it is."""

from __future__ import annotations

import json
import os
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


def test_the_exit_status_and_the_whole_output_survive_the_fast_exit(tmp_path: Path) -> None:
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


def _processes_naming(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


@pytest.mark.parametrize("flags", [["--help"], ["--no-such-flag"]], ids=["help", "bad-flag"])
def test_the_scan_child_forked_at_the_start_is_reaped_however_the_command_ends(
    tmp_path: Path, flags: list[str]
) -> None:
    """`scan` forks the CRI client's child before it parses a flag (reaper.__main__)."""
    marker = f"--state-file={tmp_path}/marker-{os.getpid()}"
    proc = subprocess.run(
        [sys.executable, "-m", "reaper", "scan", *flags, marker], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == (0 if flags == ["--help"] else 2)
    assert "Traceback" not in proc.stderr
    assert _processes_naming(marker) == []  # the child, whose command line is its parent's, is gone


KEPT = """
import json, sys
from reaper.cli import main
kept = []
code = main(sys.argv[1:], kept=kept)
print(json.dumps({"code": code, "kept": sorted(type(o).__name__ for o in kept)}), file=sys.stderr)
"""


def test_a_one_shot_keeps_what_it_made_for_the_exit_to_drop(tmp_path: Path) -> None:
    """entry() leaves without freeing anything: the pass's model, the report and the memo are
    handed to it rather than freed object by object when the functions that made them return."""
    argv = scan_argv(tmp_path)
    command = [*argv[: argv.index("-m")], "-c", KEPT, *argv[argv.index("scan") :]]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    out = json.loads(proc.stderr.strip().splitlines()[-1])
    assert out["code"] == 2
    assert out["kept"] == ["Correlation", "InventoryMemo", "ScanResult", "State", "Ties", "dict"]
