"""Run the real `reaper` command against a lab, inside the lab's netns, as an operator would."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.lab import Lab
from tests.harness.probe import probe_argv
from tests.harness.probes import fake_kubelet


@dataclass(frozen=True)
class ReaperRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def doc(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.stdout)
        return parsed


def lab_flags(lab: Lab, state_file: Path) -> list[str]:
    return [
        "--netns-dir", str(lab.netns_dir),
        "--ipam-dir", str(lab.ipam_dir),
        "--cni-cache-dir", str(lab.cache_dir),
        "--cni-conf-dir", str(lab.conf_dir),
        "--cni-bin-dir", str(lab.bin_dir),
        "--runtime-endpoint", lab.endpoint,
        "--state-file", str(state_file),
    ]  # fmt: skip


def run_reaper(
    lab: Lab, command: str, state_file: Path, *extra: str, timeout: float = 120, wrap: Sequence[str] = ()
) -> ReaperRun:
    """`reaper COMMAND` in the lab's netns; `wrap` runs it under another command (`unshare ...`)."""
    argv = ["nsenter", f"--net={lab.netns_path}", *wrap, sys.executable, "-m", "reaper", command]
    argv += lab_flags(lab, state_file) + list(extra)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return ReaperRun(proc.returncode, proc.stdout, proc.stderr)


def attachments_by_key(doc: dict[str, Any]) -> dict[tuple[str | None, str | None, str | None], dict[str, Any]]:
    out = {}
    for a in doc["attachments"]:
        key = (a["container_id"], a["network"], a["ifname"])
        if a["container_id"] is None:
            key = (None, None, a["resources"][0]["name"])
        assert key not in out, f"two attachments with key {key}"
        out[key] = a
    return out


def kinds(attachment: dict[str, Any]) -> list[str]:
    return sorted(r["kind"] for r in attachment["resources"])


def names(attachment: dict[str, Any], kind: str) -> set[str]:
    return {r["name"] for r in attachment["resources"] if r["kind"] == kind}


def kubelet_argv(*flags: str, prefix: Sequence[str] = ()) -> list[str]:
    """A fake kubelet's command line: `prefix` (unshare, chroot, setpriv ...), then a process
    named kubelet whose command line holds `flags`."""
    return [*prefix, *probe_argv(fake_kubelet, "quiet", "", *flags)]


def run_reaper_discovering(
    lab: Lab,
    command: str,
    state_file: Path,
    sockets: dict[str, Path],
    *extra: str,
    kubelets: Sequence[Sequence[str]] = (),
    timeout: float = 120,
    links: dict[str, str] | None = None,
) -> ReaperRun:
    """`reaper COMMAND` with no --runtime-endpoint, in the lab's netns and a mount namespace of
    its own whose /run is an empty tmpfs holding only `sockets` (path there -> socket file here),
    bind-mounted: the reaper then finds exactly these runtimes, as it would on a node, and the
    host's /run is neither seen nor touched. `links`: symlinks made there after (path -> target).

    With `kubelets` (command lines, see kubelet_argv), also in a pid namespace of its own with
    its own /proc: they are started there first, and the reaper is that namespace's pid 1, the
    "host's init" a kubelet is compared with (this machine's own may not be inspectable). When
    the reaper exits, the kernel ends every process left in the namespace."""
    flags = lab_flags(lab, state_file)
    at = flags.index("--runtime-endpoint")
    del flags[at : at + 2]
    if command == "doctor":  # doctor refuses the flags it has no check for
        at = flags.index("--state-file")
        del flags[at : at + 2]
    script = ["mount -t tmpfs cni-reaper-test /run"]
    for inside, outside in sockets.items():
        script.append(f"mkdir -p {shlex.quote(os.path.dirname(inside))} && touch {shlex.quote(inside)}")
        script.append(f"mount --bind {shlex.quote(str(outside))} {shlex.quote(inside)}")
    for link, target in (links or {}).items():
        script.append(
            f"mkdir -p {shlex.quote(os.path.dirname(link))} && ln -s {shlex.quote(target)} {shlex.quote(link)}"
        )
    for kubelet in kubelets:
        script.append("{ " + " ".join(shlex.quote(a) for a in kubelet) + " & }")
    if kubelets:
        named = f'[ "$(grep -lx kubelet /proc/[0-9]*/comm 2>/dev/null | wc -l)" -ge {len(kubelets)} ]'
        script.append(f"timeout 60 sh -c {shlex.quote(f'until {named}; do sleep 0.05; done')}")
    reaper = [sys.executable, "-m", "reaper", command, *flags, *extra]
    script.append("exec " + " ".join(shlex.quote(a) for a in reaper))
    argv = ["nsenter", f"--net={lab.netns_path}", "unshare", "--mount", "--propagation", "private"]
    if kubelets:
        argv += ["--pid", "--fork", "--mount-proc", "--kill-child"]
    argv += ["sh", "-c", " && ".join(script)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return ReaperRun(proc.returncode, proc.stdout, proc.stderr)
