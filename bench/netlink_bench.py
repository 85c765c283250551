"""The reaper's netlink writes, by each writer: pyroute2's IPRoute and the hand-written socket
of reaper/host/netlink.py.

Each round runs one child process a writer, in turns (A/B, then B/A), each in a network
namespace of its own (`unshare --net`: nothing outside it is touched, and it is gone when the
child exits). A child makes N veth pairs and N policy rules there (`ip -batch`, not timed),
reads them with the reaper's own reader, then deletes the host end of every veth, then every
rule, as the reaper's reclaim does (one acknowledged request each): the wall time of each, and
the peak resident memory while deleting (VmHWM, reset just before). Then pyroute2's import, in
a fresh interpreter beside a bare one, in turns: what a one-shot pass that deletes pays once.

    .venv/bin/python -m bench.netlink_bench [N] [--rounds R]     (root; N defaults to 2000)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from reaper.host.netlink import RawRule, delete_links, delete_rules, dump_links, dump_rules

WRITERS = ("hand", "pyroute2")
_PREFIX = "nlb"
_TABLE = 1000


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def _reset_peak() -> None:
    """VmHWM back to the current RSS (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
        clear.write("5")


def _pyroute2_links(indexes: list[int]) -> list[str | None]:
    from pyroute2 import IPRoute  # noqa: PLC0415

    out: list[str | None] = []
    with IPRoute() as ipr:
        for index in indexes:
            try:
                ipr.link("del", index=index)
                out.append(None)
            except Exception as err:  # pyroute2's NetlinkError and OSErrors alike
                out.append(str(err))
    return out


def _pyroute2_rules(rules: list[RawRule]) -> list[str | None]:
    from pyroute2 import IPRoute  # noqa: PLC0415

    out: list[str | None] = []
    with IPRoute() as ipr:
        for rule in rules:
            fields: dict[str, Any] = {
                "family": rule.family,
                "priority": rule.priority,
                "table": rule.table,
                "action": rule.action,
                "flags": rule.flags,
                "tos": rule.tos,
            }
            if rule.src is not None:
                fields |= {"src": rule.src, "src_len": rule.src_len}
            if rule.dst is not None:
                fields |= {"dst": rule.dst, "dst_len": rule.dst_len}
            try:
                ipr.rule("del", **fields)
                out.append(None)
            except Exception as err:  # pyroute2's NetlinkError and OSErrors alike
                out.append(str(err))
    return out


def _hand_links(indexes: list[int]) -> list[str | None]:
    return list(delete_links(indexes).values())


DELETERS: dict[str, tuple[Callable[[list[int]], list[str | None]], Callable[[list[RawRule]], list[str | None]]]] = {
    "hand": (_hand_links, delete_rules),
    "pyroute2": (_pyroute2_links, _pyroute2_rules),
}


def _make(count: int) -> None:
    lines = [f"link add {_PREFIX}{i} type veth peer name {_PREFIX}p{i}" for i in range(count)]
    lines += [f"rule add from 10.{i >> 8 & 255}.{i & 255}.1 lookup {_TABLE} pref 900" for i in range(count)]
    subprocess.run(["ip", "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True)


def child(writer: str, count: int) -> dict[str, Any]:
    """In a private netns: make the links and rules, then delete them with `writer`."""
    _make(count)
    links = [link.ifindex for link in dump_links() if link.name.startswith(_PREFIX) and "p" not in link.name[3:]]
    rules = [r for r in dump_rules() if r.table == _TABLE]
    if len(links) != count or len(rules) != count:
        raise SystemExit(f"made {len(links)} links and {len(rules)} rules, not {count} each")
    delete_link_list, delete_rule_list = DELETERS[writer]
    if writer == "pyroute2":
        from pyroute2 import IPRoute  # noqa: PLC0415, F401  (its import is measured on its own)
    _reset_peak()
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    link_errors = delete_link_list(links)
    links_s = time.perf_counter() - start
    start = time.perf_counter()
    rule_errors = delete_rule_list(rules)
    rules_s = time.perf_counter() - start
    left = [link for link in dump_links() if link.name.startswith(_PREFIX)] + [
        r for r in dump_rules() if r.table == _TABLE
    ]
    failed = [e for e in link_errors + rule_errors if e is not None]
    if failed or left:
        raise SystemExit(f"{writer}: {len(failed)} errors ({failed[:3]}), {len(left)} left")
    return {"links_s": links_s, "rules_s": rules_s, "peak_growth_kib": _status_kib("VmHWM") - before}


_IMPORT_PROBE = """
import json, time
def kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
before, start = kib(), time.perf_counter()
if {load}:
    from pyroute2 import IPRoute
    IPRoute().close()
print(json.dumps({{"s": time.perf_counter() - start, "kib": kib() - before}}))
"""


def _import_cost(load: bool) -> dict[str, float]:
    """A fresh interpreter's cost of importing pyroute2 and opening one IPRoute (or nothing)."""
    code = _IMPORT_PROBE.format(load=load)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def _run_child(writer: str, count: int) -> dict[str, Any]:
    argv = ["unshare", "--net", sys.executable, "-m", "bench.netlink_bench", "--child", writer, str(count)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("count", nargs="?", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=WRITERS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.count)))
        return
    if os.geteuid() != 0:
        raise SystemExit("bench.netlink_bench: needs root (it makes a network namespace)")
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in WRITERS}
    for turn in range(args.rounds):
        for writer in WRITERS if turn % 2 == 0 else WRITERS[::-1]:
            runs[writer].append(_run_child(writer, args.count))
    imports: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for turn in range(max(5, args.rounds)):
        for load in (False, True) if turn % 2 == 0 else (True, False):
            imports[load].append(_import_cost(load))

    def median(writer: str, key: str) -> float:
        return float(statistics.median(run[key] for run in runs[writer]))

    print(f"{socket.gethostname()}, {args.count} veth pairs and {args.count} rules, {args.rounds} rounds (medians)")
    print(f"{'writer':<10} {'links s':>9} {'rules s':>9} {'peak growth MiB':>16}")
    for writer in WRITERS:
        growth = median(writer, "peak_growth_kib") / 1024
        print(f"{writer:<10} {median(writer, 'links_s'):9.3f} {median(writer, 'rules_s'):9.3f} {growth:16.1f}")
    for writer in WRITERS:
        each = ", ".join(f"{run['links_s']:.2f}/{run['rules_s']:.3f}" for run in runs[writer])
        print(f"{writer}, each round's links/rules seconds: {each}")
    for key, label in (("links_s", "links"), ("rules_s", "rules")):
        ratio = median("pyroute2", key) / median("hand", key)
        print(f"pyroute2 / hand, {label}: {ratio:.2f}x")
    cost_s = statistics.median(r["s"] for r in imports[True]) - statistics.median(r["s"] for r in imports[False])
    cost_kib = statistics.median(r["kib"] for r in imports[True]) - statistics.median(r["kib"] for r in imports[False])
    print(f"pyroute2 import and one IPRoute, fresh interpreter: {cost_s * 1000:.0f} ms, {cost_kib / 1024:.1f} MiB RSS")


if __name__ == "__main__":
    main()
