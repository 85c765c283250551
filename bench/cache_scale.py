"""The field's scale: N stale `cni-loopback-<id>-lo` libcni cache entries beside 100 live pods.

containerd (go-cni's `WithLoNetwork`) and CRI-O give every sandbox a loopback attachment,
network `cni-loopback`, ifname `lo`, and libcni caches its result like any other: on nodes whose
runtime lost track of its sandboxes they pile up (cri-o#4296 saw 8,112; multus#1488 reports
300,000 cache files on one node). For N = 30,000 and 300,000 this prints, at default settings
(--min-age 10m, --confirmations 2, --max-reap 100):

  one-shot:  `reaper reap --json` as a timer runs it, two runs (the first counts the first
             confirmation, the second reclaims): wall seconds and peak RSS of each process;
  agent:     the agent's pass in one process, as `reaper run` runs it (reaper.agent.Agent's
             run_pass, its memo and counts carried from pass to pass), pass after pass until
             the node is clean or the bench's time for it is spent: seconds and peak RSS of
             each pass (VmHWM, reset before each), entries freed;
  then the passes to clean (measured, or projected from the last pass's rate when the time
  ran out) and what that is at the agent's 60 s interval.

The node: 100 live pods, each a real netns pin, a bridge `eth0` cache entry naming its address
and a loopback entry, listed by a fake CRI runtime (a grpc server in this process, answering
Version, ListPodSandbox and PodSandboxStatus; a real containerd with 100 pods takes minutes to
build and changes nothing the reaper reads of these entries); the stale entries are written
byte for byte as libcni writes them (`json.Marshal` of its cachedInfo, the loopback plugin's
result), an hour old, naming netns pins that are gone.

Run as root: `make bench` (or `.venv/bin/python -m bench.cache_scale [N ...]`). The bench
re-runs itself in a network and mount namespace of its own: the pins, the reaper's netlink
and iptables view stay there, and everything goes with the temp dir at the end. Prints
figures; asserts none.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reaper.settings import confirmation_spacing
from tests.harness.loopback import LOOPBACK_NETWORK as LOOPBACK
from tests.harness.loopback import cached_info, loopback_entry

ROOT = Path(__file__).resolve().parent.parent
SIZES = (30_000, 300_000)
LIVE = 100
NETWORK = "benchnet"
AGE = 3600.0  # seconds: the stale entries' age, well past --min-age
INTERVAL = 60.0  # the agent's default --interval
# Seconds of agent passes a size may take before the rest is projected.
AGENT_BUDGET = float(os.environ.get("CACHE_SCALE_AGENT_SECONDS", "600"))
MIB = 1024 * 1024


def bridge_conflist(bridge: str, ipam_dir: Path) -> bytes:
    ipam = {"type": "host-local", "dataDir": str(ipam_dir), "ranges": [[{"subnet": "10.244.0.0/16"}]]}
    plugins = [{"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": True, "ipam": ipam}]
    return json.dumps({"cniVersion": "1.0.0", "name": NETWORK, "plugins": plugins}, indent=2).encode()


def bridge_entry(container_id: str, netns: str, conflist: bytes, ip: str, veth: str) -> bytes:
    result = {
        "cniVersion": "1.0.0",
        "dns": {},
        "interfaces": [{"name": "cni0"}, {"name": veth}, {"name": "eth0", "sandbox": netns}],
        "ips": [{"address": f"{ip}/16", "gateway": "10.244.0.1", "interface": 2}],
    }
    return cached_info(container_id, NETWORK, "eth0", conflist, netns, result)


# --------------------------------------------------------------------------- the node


def count_stale(results: Path) -> int:
    """The loopback entries in `results` of no live pod (one with no eth0 entry beside it)."""
    names = os.listdir(results)
    live = {name[len(NETWORK) + 1 : -len("-eth0")] for name in names if name.startswith(f"{NETWORK}-")}
    prefix = f"{LOOPBACK}-"
    return sum(1 for name in names if name.startswith(prefix) and name[len(prefix) : -len("-lo")] not in live)


class Node:
    """The dirs of a node under `base`, 100 live pods, and the flags pointing the reaper there."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.netns = base / "netns"
        self.ipam = base / "ipam"
        self.cache = base / "cache"
        self.results = self.cache / "results"
        self.conf = base / "conf"
        self.bin = base / "bin"
        for d in (self.netns, self.ipam, self.conf, self.bin):
            d.mkdir(parents=True)
        self.results.mkdir(parents=True, mode=0o700)
        self.conflist = bridge_conflist("cni0", self.ipam)
        (self.conf / f"10-{NETWORK}.conflist").write_bytes(self.conflist)
        self.state = base / "state.json"
        self.live: dict[str, str] = {}  # sandbox ID -> its pin

    def add_live(self, count: int) -> None:
        """`count` pods: a pinned netns each, a lease, its eth0 and lo cache entries."""
        lease_dir = self.ipam / NETWORK
        lease_dir.mkdir(exist_ok=True)
        for n in range(count):
            cid = secrets.token_hex(32)
            pin = self.netns / f"cni-{uuid.uuid4()}"
            pin.touch()
            subprocess.run(["unshare", f"--net={pin}", "true"], check=True)
            ip = f"10.244.{1 + n // 250}.{1 + n % 250}"
            (lease_dir / ip).write_bytes(f"{cid}\r\neth0".encode())
            self._write(f"{NETWORK}-{cid}-eth0", bridge_entry(cid, str(pin), self.conflist, ip, f"veth{cid[:8]}"), 0)
            self._write(f"{LOOPBACK}-{cid}-lo", loopback_entry(cid, str(pin)), 0)
            self.live[cid] = str(pin)

    def _write(self, name: str, data: bytes, age: float) -> None:
        fd = os.open(self.results / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            if age:
                now = time.time()
                os.utime(fd, (now - age, now - age))
        finally:
            os.close(fd)

    def stale(self) -> int:
        return count_stale(self.results)

    def top_up(self, count: int) -> float:
        """Stale loopback entries until there are `count`; the seconds it took."""
        t = time.perf_counter()
        for _ in range(count - self.stale()):
            cid = secrets.token_hex(32)
            self._write(f"{LOOPBACK}-{cid}-lo", loopback_entry(cid, str(self.netns / f"cni-{uuid.uuid4()}")), AGE)
        return time.perf_counter() - t

    def remove(self) -> None:
        """Unpin the live pods' namespaces, then remove the node's dirs."""
        for pin in self.live.values():
            subprocess.run(["umount", "--lazy", pin], check=False)
        shutil.rmtree(self.base)

    def flags(self, endpoint: str) -> list[str]:
        return [
            "--netns-dir", str(self.netns),
            "--ipam-dir", str(self.ipam),
            "--cni-cache-dir", str(self.cache),
            "--cni-conf-dir", str(self.conf),
            "--cni-bin-dir", str(self.bin),
            "--runtime-endpoint", endpoint,
            "--state-file", str(self.state),
        ]  # fmt: skip


# --------------------------------------------------------------------------- the runs


def one_shot(flags: list[str], base: Path) -> dict[str, Any]:
    """`reaper reap --json` at default settings: wall seconds, peak RSS (wait4), entries freed."""
    argv = [sys.executable, "-m", "reaper", "reap", "--json", *flags]
    out_path, err_path = base / "reap.json", base / "reap.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4
    try:
        doc = json.loads(out_path.read_bytes())
    except ValueError:
        doc = {}
    freed = sum(1 for o in doc.get("reclaimed", ()) if all(r.get("ok") for r in o.get("resources", ())))
    last = err_path.read_text(errors="replace").strip().splitlines()[-1:] if proc.returncode not in (0, 1) else []
    return {"wall": wall, "rss": usage.ru_maxrss / 1024, "freed": freed, "exit": proc.returncode, "stderr": last}


def agent_passes(flags: list[str], budget: float) -> list[dict[str, Any]]:
    """The agent's passes in a child process (`--agent`), one JSON line each."""
    argv = [sys.executable, "-m", "bench.cache_scale", "--agent", str(budget), *flags]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=budget + 3600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 and not rows:
        raise RuntimeError(f"agent child exited {proc.returncode}: {proc.stderr[-2000:]}")
    return rows


def _vm_hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_agent(budget: float, flags: list[str]) -> None:
    """In the child: the agent's passes as `reaper run` makes them, until no stale loopback
    entry is left or `budget` seconds are spent; a JSON line after each pass."""
    from msgspec.structs import replace  # noqa: PLC0415

    from reaper.agent import Agent  # noqa: PLC0415
    from reaper.cli import build_parser  # noqa: PLC0415
    from reaper.runtime.liveness import liveness_from  # noqa: PLC0415
    from reaper.settings import agent_settings_from, reap_settings_from, settings_from  # noqa: PLC0415

    args = build_parser().parse_args(["run", "--mode", "reap", *flags, "--events", "off"])
    settings = settings_from(args, {})
    # The passes here come back to back; on a node they come --interval apart, and the
    # confirmation spacing (half of it) lets each of them count. Without this, the first
    # passes of a fast run would count one confirmation between them and inflate the passes
    # to clean.
    settings = replace(settings, policy=replace(settings.policy, confirmation_spacing=0.0))
    log = logging.getLogger("bench.agent")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    agent = Agent(settings, reap_settings_from(args, {}), agent_settings_from(args, {}), liveness_from(settings), log)
    results = Path(settings.find.cache_dir) / "results"
    started = time.monotonic()
    before = count_stale(results)
    while True:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
        t = time.perf_counter()
        agent.run_pass()
        seconds = time.perf_counter() - t
        left = count_stale(results)
        print(json.dumps({"seconds": seconds, "rss": _vm_hwm_mib(), "freed": before - left, "left": left}), flush=True)
        before = left
        if not left or time.monotonic() - started > budget:
            return


# --------------------------------------------------------------------------- the report


@contextlib.contextmanager
def fake_runtime(base: Path, live: dict[str, str]) -> Iterator[str]:
    from tests.harness.fake_cri import FakeRuntime, sandbox, sandbox_list  # noqa: PLC0415

    listed = sandbox_list(sandbox(cid, created_at=time.time_ns() - int(AGE * 1e9)) for cid in live)
    with FakeRuntime(base / "cri.sock", listed, dict(live)) as runtime:
        yield runtime.endpoint


def projected(rows: list[dict[str, Any]], stale: int) -> tuple[int, bool]:
    """Passes to clean: measured when the last pass left none, else the passes so far plus the
    rest at the last pass's rate (None when it freed nothing)."""
    if rows and rows[-1]["left"] == 0:
        return len(rows), True
    rate = rows[-1]["freed"] if rows else 0
    if rate <= 0:
        return -1, False
    return len(rows) + math.ceil(rows[-1]["left"] / rate), False


def measure(size: int, tmp: Path) -> None:
    base = tmp / f"n{size}"
    node = Node(base)
    t = time.perf_counter()
    node.add_live(LIVE)
    built = node.top_up(size) + (time.perf_counter() - t)
    with fake_runtime(base, node.live) as endpoint:
        flags = node.flags(endpoint)
        first = one_shot(flags, base)
        # As a timer's runs come: the next one counts only once the confirmation spacing has
        # passed since this one (runs seconds apart count once).
        time.sleep(confirmation_spacing(INTERVAL))
        second = one_shot(flags, base)
        node.state.unlink(missing_ok=True)
        node.top_up(size)
        rows = agent_passes(flags, AGENT_BUDGET)
    passes, measured = projected(rows, size)
    print(f"\nN = {size:,} stale loopback entries beside {LIVE} live pods (built in {built:.0f} s)")
    for label, run in (("one-shot reap, 1st run", first), ("one-shot reap, 2nd run", second)):
        extra = f"  exit {run['exit']} {run['stderr']}" if run["stderr"] else ""
        print(f"  {label}: {run['wall']:.2f} s, peak RSS {run['rss']:.1f} MiB, freed {run['freed']:,}{extra}")
    print(f"  {'agent pass':>12} {'seconds':>8} {'peak RSS MiB':>13} {'freed':>8} {'left':>8}")
    for n, row in enumerate(rows, 1):
        print(f"  {n:>12} {row['seconds']:>8.2f} {row['rss']:>13.1f} {row['freed']:>8,} {row['left']:>8,}")
    if rows:
        worst = max(r["seconds"] for r in rows)
        peak = max(r["rss"] for r in rows)
        print(f"  agent: slowest pass {worst:.2f} s, highest peak RSS {peak:.1f} MiB")
    if passes < 0:
        print("  passes to clean: never (the last pass freed nothing)")
    else:
        how = "measured" if measured else "projected from the last pass"
        hours = passes * INTERVAL / 3600
        print(f"  passes to clean: {passes:,} ({how}), {hours:.1f} h at the agent's {INTERVAL:.0f} s interval")
    node.remove()


def main(argv: list[str]) -> None:
    if argv[:1] == ["--agent"]:
        run_agent(float(argv[1]), argv[2:])
        return
    if os.environ.get("CACHE_SCALE_INSIDE") != "1":
        env = {**os.environ, "CACHE_SCALE_INSIDE": "1"}
        command = ["unshare", "--net", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc"]
        command += ["--", sys.executable, "-m"]
        raise SystemExit(subprocess.call([*command, "bench.cache_scale", *argv], cwd=ROOT, env=env))
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    sizes = tuple(int(a) for a in argv) or SIZES
    print(
        f"cache_scale: stale `{LOOPBACK}-<id>-lo` entries beside {LIVE} live pods (fake CRI runtime), default "
        f"settings; agent passes for up to {AGENT_BUDGET:.0f} s a size, then projected",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="cache-scale-") as tmp:
        for size in sizes:
            measure(size, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
