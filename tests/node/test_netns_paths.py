"""Nothing a file names can block a pass: a cache entry whose `netns` names a path on a FUSE
mount whose server answers only the handshake (an allow_other FUSE, or a pod's FUSE or NFS
volume reached through /proc/<pid>/root/...) is reported, and the pass goes on. Before, `reaper
scan` waited in stat(2) on that path for good, in state D, beyond the reach of SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.configs import cache_doc, conflist
from tests.harness.fake_cri import FakeRuntime, sandbox_list
from tests.harness.probe import probe_argv
from tests.harness.probes import netns_place
from tests.harness.silent_fuse import SilentFuse, run_beside

CID = "f" * 64
NET = "mynet"
# Long enough for a reaper on a loaded machine; a pass waiting on the mount never ends at all.
TIMEOUT = 120


def _scan(tmp: Path, endpoint: str, prefix: list[str]) -> list[str]:
    for sub in ("net.d", "networks", "cni/results", "netns", "bin"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    (tmp / "net.d" / "10-mynet.conflist").write_bytes(conflist(NET))
    d = str(tmp)
    return [*prefix, "unshare", "--net", "--", sys.executable, "-m", "reaper", "scan", "--json",
            "--cni-conf-dir", f"{d}/net.d", "--ipam-dir", f"{d}/networks", "--cni-cache-dir", f"{d}/cni",
            "--netns-dir", f"{d}/netns", "--cni-bin-dir", f"{d}/bin", "--runtime-endpoint", endpoint,
            "--state-file", f"{d}/state.json", "--min-age", "0"]  # fmt: skip


def _scan_beside(fuse: SilentFuse, tmp: Path, netns: str, prefix: list[str]) -> dict[str, Any]:
    entry = tmp / "cni" / "results" / f"{NET}-{CID}-eth0"
    with FakeRuntime(tmp / "cri.sock", sandbox_list([]), {}) as runtime:
        argv = _scan(tmp, runtime.endpoint, prefix)
        entry.write_text(json.dumps(cache_doc(CID, NET, config=json.loads(conflist(NET)), netns=netns)))
        try:
            proc = run_beside(fuse, argv, TIMEOUT)
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"reaper scan still waiting after {TIMEOUT} s on {netns}; stderr: {err.stderr!r}")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _assert_reported(doc: dict[str, Any], netns: str) -> None:
    (attachment,) = [a for a in doc["attachments"] if a["container_id"] == CID]
    (cache,) = [r for r in attachment["resources"] if r["kind"] == "cache"]
    assert cache["name"] == f"{NET}-{CID}-eth0"
    assert "not looked at" in str(cache.get("netns_refused"))
    (record,) = [c for c in doc["corrupt"] if c["path"].endswith(cache["name"])]
    assert "not looked at" in record["error"] and netns[:40] in record["error"]


def test_a_pods_silent_fuse_volume_reached_through_proc_root(tmp_path: Path) -> None:
    """The path a hostPID pod could write: its own FUSE volume, seen from the host's /proc."""
    with SilentFuse(tmp_path / "volume") as fuse:
        netns = fuse.reach("net")
        _assert_reported(_scan_beside(fuse, tmp_path, netns, []), netns)


def test_an_allow_other_silent_fuse_mounted_where_the_reaper_runs(tmp_path: Path) -> None:
    """The reaper in the mount namespace that holds the FUSE mount, the path a plain one."""
    with SilentFuse(tmp_path / "mnt") as fuse:
        netns = str(tmp_path / "mnt" / "net")
        inside = ["nsenter", f"--mount=/proc/{fuse.pid}/ns/mnt"]
        _assert_reported(_scan_beside(fuse, tmp_path, netns, inside), netns)


def test_a_fuse_mounted_on_a_pin_in_a_netns_dir_is_refused_without_asking_its_server(tmp_path: Path) -> None:
    """Only root of the mount namespace can mount on a pin; even then the lookup of a name in a
    netns dir asks no filesystem server (statx, AT_STATX_DONT_SYNC) and takes nothing but a
    namespace or a stale file there."""
    pin = tmp_path / "netns" / "cni-1"
    with SilentFuse(pin, on_file=True) as fuse:
        inside = ["nsenter", f"--mount=/proc/{fuse.pid}/ns/mnt", *probe_argv(netns_place)]
        try:
            proc = run_beside(fuse, [*inside, str(pin.parent), str(pin)], TIMEOUT)
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"the look at {pin} still waiting after {TIMEOUT} s; stderr: {err.stderr!r}")
    assert proc.returncode == 0, proc.stderr
    assert "another filesystem is mounted there" in proc.stdout, proc.stdout
