"""Benchmark of the address check a reap makes before acting: reading the addresses of N pinned
namespaces (each with lo up and one address), as reaper.host.netns_addrs reads them (one thread
joining each namespace in turn, a netlink socket made there), and the whole check as a pass
runs it (the /proc walk, the netns dir listing, every namespace read, the decision). For
comparison, pyroute2's NetNS(path, flags=0) (a forked child per namespace) on a few of them.

Run as root: `.venv/bin/python -m bench.netns_addrs_bench [N]` (N defaults to 200). It runs in
a private mount and network namespace of its own: the pins vanish with it. Prints a table.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.orphans import orphan_leasing
from reaper.host.netns_addrs import Handle, NamespaceToRead, read_addresses
from reaper.kinds import hostlocal
from reaper.model import NsKey
from reaper.reap.addresses import addresses_in_use

INSIDE = "REAPER_BENCH_NETNS_ADDRS"
ROUNDS = 5
PYROUTE2_SAMPLE = 20


def _make_pins(work: str, count: int) -> list[tuple[str, NsKey]]:
    pins = []
    for i in range(count):
        path = os.path.join(work, f"cni-{i:08x}-0000-0000-0000-000000000000")
        open(path, "w").close()
        script = f"ip link set lo up && ip addr add 10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}/32 dev lo"
        subprocess.run(["unshare", f"--net={path}", "sh", "-c", script], check=True)
        st = os.stat(path)
        pins.append((path, NsKey(st.st_dev, st.st_ino)))
    return pins


def _median_ms(run: object, rounds: int = ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _pyroute2(pins: list[tuple[str, NsKey]]) -> int:
    from pyroute2 import NetNS  # noqa: PLC0415

    found = 0
    for path, _ in pins:
        with NetNS(path, flags=0) as ns:
            found += len(list(ns.get_addr()))
    return found


def main(count: int) -> None:
    work = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", work], check=True)
    started = time.perf_counter()
    pins = _make_pins(work, count)
    made = time.perf_counter() - started
    targets = [NamespaceToRead(ns, path, (Handle(path, pinned=True),)) for path, ns in pins]

    def read() -> None:
        got = read_addresses(targets, deadline=time.monotonic() + 60)
        assert all(r.error is None and len(r.addresses) == 3 for r in got), got[:3]

    orphan, lease = orphan_leasing("10.99.0.1", "d" * 64)
    identity = hostlocal.KIND.identity(lease)

    def check() -> None:
        assert addresses_in_use([orphan], {identity: lease}, (work,)) == {}

    reader = _median_ms(read)
    whole = _median_ms(check)
    sample = pins[:PYROUTE2_SAMPLE]
    forked = _median_ms(lambda: _pyroute2(sample), rounds=3) / len(sample)
    print(f"namespaces pinned:                     {count} (made in {made:.1f} s)")
    print(f"read_addresses, all of them:           {reader:8.1f} ms  ({reader / count * 1000:6.0f} us a namespace)")
    print(f"addresses_in_use, the whole check:     {whole:8.1f} ms  (walk of /proc, listing, reads, decision)")
    print(f"pyroute2 NetNS(path, flags=0), forked: {forked * count:8.1f} ms  ({forked * 1000:6.0f} us a namespace)")


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    if os.environ.get(INSIDE) != "1":
        env = {**os.environ, INSIDE: "1"}
        argv = ["unshare", "--mount", "--propagation", "private", "--net", sys.executable, "-m", __spec__.name, str(n)]
        sys.exit(subprocess.run(argv, env=env, check=False).returncode)
    main(n)
