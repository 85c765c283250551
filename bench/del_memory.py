"""Memory of a reclaim burst: the agent plus the plugin DELs it runs at once, by --del-concurrency.

The chart gives the agent's container 256 MiB, and every plugin DEL (a process of its own: the
plugins of the chain one after another, and what they start, such as iptables) is charged to
that container. Each round builds LEAKS fresh leaked attachments on a lab (a real containerd;
the bridge, host-local and ipMasq plugins' objects, bench/build_leaks.py) and starts `reaper run
--mode reap` with one --del-concurrency, sampling the resident memory of its whole process tree
(psutil) until a pass has reclaimed them. The values are taken in turns, ROUNDS times, on one lab.

The sum of RSS counts pages the processes share (the interpreter's libraries, a plugin binary's
text run twice, a forked copy of the agent) once for each: it is at or above what the container
is charged for them. The sum of PSS splits each shared page among its sharers.

Run as root: `.venv/bin/python -m bench.del_memory [N ...]` (the concurrencies, default 1 2 4 8
16). Prints, for each: the peak of the tree (RSS, and PSS, where a shared page counts once), of
the agent alone, of the plugin processes together, the most of them at once and the largest one.
The agent's own forked helpers (a mount namespace reader) share the interpreter's pages with it:
their RSS is in the tree's RSS, counted twice, and only their own pages are in the PSS.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import psutil
from msgspec import Struct

from bench.build_leaks import make_attachments
from tests.harness.lab import Lab
from tests.harness.reaper_cli import lab_flags

LEAKS = 200
ROUNDS = 2
CONCURRENCIES = (1, 2, 4, 8, 16)
SAMPLE_EVERY = 0.005  # seconds
MAX_PASSES = 5
MIB = 1 << 20


class Peak(Struct, kw_only=True):
    """The highest of the samples, in bytes."""

    tree_rss: int = 0  # the agent and every process under it
    tree_pss: int = 0  # the same in proportional set size: a shared page split among its sharers
    agent: int = 0  # the agent alone (RSS)
    plugins: int = 0  # the plugin processes (and what they start, such as iptables), RSS together
    plugin_count: int = 0  # the most plugin processes at one sample
    largest_plugin: int = 0  # the largest single plugin process (RSS)
    forks: int = 0  # the agent's own forked helpers (a copy of the interpreter: RSS shared with it)
    samples: int = 0


class Size(NamedTuple):
    rss: int
    pss: int
    plugin: bool  # not the reaper's own interpreter


def _size(process: psutil.Process) -> Size | None:
    """Rss and Pss as the kernel sums them over the process's mappings (smaps_rollup): both
    from one read, so that they describe the same moment."""
    try:
        name = process.name()
        with open(f"/proc/{process.pid}/smaps_rollup", "rb") as f:
            rollup = f.read().decode()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
        return None  # gone between the listing and the read: a DEL that just ended
    kib = {key: int(rest.split()[0]) for key, _, rest in (line.partition(":") for line in rollup.splitlines()[1:])}
    return Size(kib.get("Rss", 0) * 1024, kib.get("Pss", 0) * 1024, not name.startswith("python"))


def sample(pid: int, done: threading.Event, peak: Peak) -> None:
    """Until `done`: the memory of `pid` and of each process under it, the peaks kept."""
    agent = psutil.Process(pid)
    while not done.is_set():
        try:
            children = agent.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        own = _size(agent)
        if own is None:
            return
        sizes = [size for size in map(_size, children) if size is not None]
        plugins = [size.rss for size in sizes if size.plugin]
        peak.tree_rss = max(peak.tree_rss, own.rss + sum(size.rss for size in sizes))
        peak.tree_pss = max(peak.tree_pss, own.pss + sum(size.pss for size in sizes))
        peak.agent = max(peak.agent, own.rss)
        peak.plugins = max(peak.plugins, sum(plugins))
        peak.plugin_count = max(peak.plugin_count, len(plugins))
        peak.largest_plugin = max([peak.largest_plugin, *plugins])
        peak.forks = max(peak.forks, sum(size.rss for size in sizes if not size.plugin))
        peak.samples += 1
        time.sleep(SAMPLE_EVERY)


def burst(lab: Lab, state: Path, log: Path, concurrency: int) -> tuple[Peak, int]:
    """The agent's passes over the lab's leaks until they are reclaimed: its peaks, and the
    attachments it reclaimed."""
    argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", "run", "--mode", "reap"]
    argv += [*lab_flags(lab, state), "--interval", "3s", "--log-format", "json", "--events", "off"]
    argv += ["--min-age", "0", "--confirmations", "1", "--max-orphan-ratio", "1", "--max-reap", "100000"]
    argv += ["--listen", "127.0.0.1:19753", "--del-concurrency", str(concurrency)]
    peak, done = Peak(), threading.Event()
    with open(log, "wb") as out:
        agent = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        sampler = threading.Thread(target=sample, args=(agent.pid, done, peak))
        sampler.start()
        try:
            # A pass may leave the leaks for the next (a process that ended during its address
            # check); passes follow every few seconds until one reclaimed them.
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                text = log.read_text()
                if text.count('"msg": "reclaimed"') >= LEAKS or text.count('"msg": "pass"') >= MAX_PASSES:
                    break
                if agent.poll() is not None:
                    raise RuntimeError(f"the agent exited {agent.returncode}: {log.read_text()[-2000:]}")
                time.sleep(0.1)
        finally:
            done.set()
            sampler.join()
            agent.send_signal(signal.SIGTERM)
            agent.wait(60)
    return peak, log.read_text().count('"msg": "reclaimed"')


def main() -> None:
    concurrencies = tuple(int(arg) for arg in sys.argv[1:]) or CONCURRENCIES
    rows: dict[int, list[Peak]] = {n: [] for n in concurrencies}
    with Lab(subnet="10.203.0.0/18") as lab, tempfile.TemporaryDirectory() as tmp:
        first = 10
        for turn in range(ROUNDS):
            for n in concurrencies:
                make_attachments(lab, LEAKS, first_host=first)
                first += LEAKS
                log = Path(tmp) / f"agent-{turn}-{n}.log"
                peak, reclaimed = burst(lab, Path(tmp) / f"state-{turn}-{n}.json", log, n)
                rows[n].append(peak)
                print(
                    f"round {turn + 1}, --del-concurrency {n}: tree RSS {peak.tree_rss / MIB:.1f} MiB, PSS "
                    f"{peak.tree_pss / MIB:.1f} (agent {peak.agent / MIB:.1f}, plugins {peak.plugins / MIB:.1f} in "
                    f"{peak.plugin_count} processes, largest {peak.largest_plugin / MIB:.1f}, the agent's forks "
                    f"{peak.forks / MIB:.1f}); {reclaimed} of {LEAKS} reclaimed; {peak.samples} samples",
                    flush=True,
                )
    print()
    print(f"{LEAKS} leaks a round, {ROUNDS} rounds in turns; peak MiB, the highest of the rounds")
    header = ("concurrency", "tree RSS", "tree PSS", "agent", "plugins", "procs", "largest")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (11, 8, 8, 7, 7, 5, 7), strict=True)))
    for n, peaks in rows.items():
        print(
            f"{n:>11} {max(p.tree_rss for p in peaks) / MIB:>8.1f} {max(p.tree_pss for p in peaks) / MIB:>8.1f} "
            f"{max(p.agent for p in peaks) / MIB:>7.1f} {max(p.plugins for p in peaks) / MIB:>7.1f} "
            f"{max(p.plugin_count for p in peaks):>5} {max(p.largest_plugin for p in peaks) / MIB:>7.1f}"
        )


if __name__ == "__main__":
    main()
