"""The pass's own ordering rule, with real pinned namespaces in a scratch netns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.harness.lab.kernel import umount


def test_snapshot_is_taken_before_the_runtime_is_asked(tmp_path: Path) -> None:
    # A sandbox whose netns appears while the runtime is listing is not in the list; were the
    # node read after the list, its fresh pin would look ownerless (and, at min-age 0, orphaned).
    scratch = tmp_path / "scratch-netns"
    scratch.touch()
    subprocess.run(["unshare", f"--net={scratch}", "true"], check=True)
    workdir = tmp_path / "work"
    workdir.mkdir()
    pin = workdir / "netns" / "cni-0d1e2f3a-1111-2222-3333-444455556666"
    try:
        proc = subprocess.run(
            ["nsenter", f"--net={scratch}", sys.executable, "-m", "tests.harness.probes.racing_scan", str(workdir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert pin.exists(), "the racing runtime did pin a netns"
        assert doc["attachments"] == []
    finally:
        for path in (pin, scratch):
            if path.exists():
                umount(str(path), 2)  # MNT_DETACH
                path.unlink()
