"""Inside the lab netns: time the floor and the scan pass in one process, print JSON.

The floor is what any scan must pay: one `ip -j -d link show`, `iptables-save` and
`ip6tables-save` of the nat and filter tables (side by side, as the pass runs them),
reading every file (and stat-ing every /proc entry) the scan reads, and every mount namespace's
mountinfo once (a task whose mount namespace may not be looked at by its first line, or whole
when that line is no namespace's read).
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

T_STDLIB = time.perf_counter()

import logging  # noqa: E402

from reaper.cli import build_parser  # noqa: E402
from reaper.host.memo import InventoryMemo  # noqa: E402
from reaper.runtime.cri import CriLiveness  # noqa: E402
from reaper.scan import scan_pass  # noqa: E402
from reaper.settings import settings_from  # noqa: E402
from reaper.state import KeptState  # noqa: E402

T_IMPORTS = time.perf_counter()
ROUNDS = int(os.environ.get("SCAN_CHILD_ROUNDS", "9"))  # interleaved rounds; fewer for a quick A/B


def _read_tree(directory: str) -> int:
    total = 0
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            total += _read_tree(entry.path)
        elif entry.is_file(follow_symlinks=False):
            with open(entry.path, "rb") as f:
                total += len(f.read())
    return total


def floor(netns_dir: str, ipam_dir: str, cache_dir: str, conf_dir: str) -> dict[str, float]:
    out = {}
    t = time.perf_counter()
    subprocess.run(["ip", "-j", "-d", "link", "show"], capture_output=True, check=True)
    out["ip_link"] = time.perf_counter() - t
    t = time.perf_counter()
    # The tables the pass reads (reaper.kinds.iptables, nat; reaper.kinds.firewall, filter) in
    # both families, side by side as the pass runs them.
    saves = [
        subprocess.Popen([f"{family}-save", "-t", table], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for family in ("iptables", "ip6tables")
        for table in ("nat", "filter")
    ]
    for save in saves:
        save.communicate()
    out["iptables_save"] = time.perf_counter() - t
    t = time.perf_counter()
    for d in (ipam_dir, os.path.join(cache_dir, "results"), conf_dir):
        _read_tree(d)
    for entry in os.scandir(netns_dir):
        os.stat(entry.path)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                os.stat(f"/proc/{pid}/ns/net")
                for tid in os.listdir(f"/proc/{pid}/task"):
                    os.stat(f"/proc/{pid}/task/{tid}/ns/net")
            except OSError:
                pass
    out["files"] = time.perf_counter() - t
    t = time.perf_counter()
    out["mountinfo_reads"] = _read_mount_namespaces()
    out["mountinfo"] = time.perf_counter() - t
    out["total"] = out["ip_link"] + out["iptables_save"] + out["files"] + out["mountinfo"]
    return out


def _read_mount_namespaces() -> int:
    """The mountinfo of every mount namespace once, raw, through the first task found in it.
    A task whose namespace may not be looked at (EACCES on ns/mnt) has its first line read
    (one read): a line some namespace read whole began with names a live mount of that one, so
    the task is in it (reaper.host.nsmounts._Heads, which also reads that namespace's first
    line again: a check, not in the floor); any other such task is read whole. How many texts
    were read whole."""
    seen: set[int] = set()
    firsts: set[bytes] = set()
    untold: list[str] = []
    reads = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            # The task dir's link count is 2 + its threads: listed only when there are several.
            several = os.stat(f"/proc/{pid}/task").st_nlink > 3
            tids = [tid for tid in os.listdir(f"/proc/{pid}/task") if tid != pid] if several else []
        except OSError:
            continue
        for base in (f"/proc/{pid}", *(f"/proc/{pid}/task/{tid}" for tid in tids)):
            try:
                ino = os.stat(f"{base}/ns/mnt").st_ino
            except PermissionError:
                untold.append(base)
                continue
            except OSError:
                continue
            if ino in seen:
                continue
            seen.add(ino)
            first = _read_whole(base)
            if first is not None:
                firsts.add(first)
                reads += 1
    for base in untold:
        try:
            fd = os.open(f"{base}/mountinfo", os.O_RDONLY)
        except OSError:
            continue
        try:
            head = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        if head.partition(b"\n")[0] not in firsts and _read_whole(base) is not None:
            reads += 1
    return reads


def _read_whole(base: str) -> bytes | None:
    """A task's mountinfo read whole, raw: its first line, or None when it cannot be opened."""
    try:
        fd = os.open(f"{base}/mountinfo", os.O_RDONLY)
    except OSError:
        return None
    try:
        chunk = os.read(fd, 1 << 20)
        first = chunk.partition(b"\n")[0]
        while chunk:
            chunk = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    return first


def main(argv: list[str]) -> None:
    args = build_parser().parse_args(["scan", *argv])
    settings = settings_from(args, {})
    log = logging.getLogger("bench")
    log.setLevel(logging.ERROR)
    liveness = CriLiveness(settings.runtime_endpoints, settings.runtime_timeout)
    memo = InventoryMemo()
    kept = KeptState()  # as `reaper run` holds it (reaper.agent): the sandboxes' answers kept
    floors = []
    one_shot = []
    agent = []
    parts: dict[str, list[float]] = {}
    scan_pass(settings, liveness, log)  # the state file, as a timer's earlier run left it
    # Interleaved, so that machine noise hits all alike. A one-shot run (a timer) reads every
    # file; the agent keeps an InventoryMemo and a KeptState in memory, as `reaper run` does.
    for _ in range(ROUNDS):
        floors.append(
            floor(
                settings.find.netns_dirs[0], settings.find.ipam_dirs[0], settings.find.cache_dir, settings.find.conf_dir
            )
        )
        t = time.perf_counter()
        scan_pass(settings, liveness, log)
        one_shot.append(time.perf_counter() - t)
        t = time.perf_counter()
        result = scan_pass(settings, liveness, log, memo=memo, kept=kept)
        agent.append(time.perf_counter() - t)
        for name, seconds in result.timings:
            parts.setdefault(name, []).append(seconds)
    floor_times = {k: statistics.median(f[k] for f in floors) for k in floors[0]}
    floor_times["best"] = min(f["total"] for f in floors)
    summary = {v: result.report.count(v) for v in ("live", "orphan", "pending", "unknown")}
    json.dump(
        {
            "stdlib_import_s": T_STDLIB - T_START,
            "reaper_import_s": T_IMPORTS - T_STDLIB,
            "floor_s": floor_times,
            "one_shot_s": min(one_shot),
            "agent_s": min(agent[1:]),  # the first fills the memo and the kept state
            "agent_parts_s": {k: min(v[1:]) for k, v in parts.items()},
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "summary": summary,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
