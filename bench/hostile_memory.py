"""Memory under hostile input: one `reaper scan --json` process with 0 / 10,000 / 100,000 junk files
in the libcni cache and in a host-local dir, and the agent's HTTP endpoint under 3,000 idle
TCP connections from 64 addresses other than its own, with /healthz asked from its own (as the
kubelet asks it).

Run as root: `make bench` (or `.venv/bin/python -m bench.hostile_memory`). Prints figures.

`--addresses [N] [--before DIR]` instead: the address check a reap makes before acting (one
orphan's lease), in a process of its own, beside a network namespace of N addresses (default
1,000,000) made by uid 65534 in its own user namespace (`unshare -Urn`), then beside one root
made: peak RSS, wall time and the verdict. With `--before DIR` (a tree of an older version's
`reaper` package, `git archive main reaper | tar -x -C DIR`), the same check of that version
too. It runs in a mount, network and PID namespace of its own: what the check sees is the
namespaces made for it, and they go with it.

Every reaper process runs in a network namespace of its own (`unshare --net`), with every path
flag pointing into a temp dir, against a fake CRI runtime: this script, started again with
`--fake-cri SOCKET`, answering Version and an empty ListPodSandbox on a unix socket in the temp
dir. Nothing of the host's runtime, network namespace or firewall is looked at or touched; the
temp dir, the processes and (with them) the namespaces are gone at the end.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import resource
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from reaper.http import MAX_CONNECTIONS, NODE_CONNECTIONS, PER_CLIENT
from tests.harness.cri import api_pb2 as pb
from tests.harness.netns_thread import in_netns

ROOT = Path(__file__).resolve().parent.parent
FILE_STEPS = (0, 10_000, 100_000)
SCAN_TIMEOUT = 180.0
FLOOD = 3_000
BATCH = 100  # connections opened at once: below the agent's listen backlog on any kernel (128 at least)
HOLD = 15.0  # seconds the flood is held open
AGENT_PORT = 9753  # free by construction: the agent's netns is new and empty
# Where the flood comes from: other hosts' addresses, as many as it takes to fill every slot they
# may have (loopback answers for all of 127/8). /healthz comes from 127.0.0.1, the address the
# agent listens on: its own, as the node IP is the kubelet's.
FLOOD_SOURCES = [f"127.0.1.{n}" for n in range(1, 65)]
NETWORK = "net1"
MIB = 1024 * 1024


# --------------------------------------------------------------------------- the fake runtime


def serve_fake_cri(socket_path: str) -> None:
    """A CRI runtime with no pods: Version and ListPodSandbox; SIGTERM stops it."""

    def version(_request: pb.VersionRequest, _context: grpc.ServicerContext) -> pb.VersionResponse:
        return pb.VersionResponse(
            version="0.1.0", runtime_name="fake-cri", runtime_version="0", runtime_api_version="v1"
        )

    def list_sandboxes(_request: pb.ListPodSandboxRequest, _context: grpc.ServicerContext) -> pb.ListPodSandboxResponse:
        return pb.ListPodSandboxResponse()

    handlers = {
        "Version": grpc.unary_unary_rpc_method_handler(
            version,
            request_deserializer=pb.VersionRequest.FromString,
            response_serializer=pb.VersionResponse.SerializeToString,
        ),
        "ListPodSandbox": grpc.unary_unary_rpc_method_handler(
            list_sandboxes,
            request_deserializer=pb.ListPodSandboxRequest.FromString,
            response_serializer=pb.ListPodSandboxResponse.SerializeToString,
        ),
    }
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("runtime.v1.RuntimeService", handlers),))
    server.add_insecure_port(f"unix://{socket_path}")
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stopping.set())
    server.start()
    stopping.wait()
    server.stop(grace=None)


@contextlib.contextmanager
def fake_cri(tmp: Path) -> Iterator[str]:
    """The fake runtime in a process of its own; yields its endpoint URL."""
    path = tmp / "cri.sock"
    with open(tmp / "fake-cri.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.hostile_memory", "--fake-cri", str(path)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not _accepts(path):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake CRI server did not start: {(tmp / 'fake-cri.log').read_text()}")
                time.sleep(0.05)
            yield f"unix://{path}"
        finally:
            stop(proc)


def _accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to this very process, then wait; SIGKILL if it does not go within 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# --------------------------------------------------------------------------- the dirs


def node_dirs(base: Path, cri: str) -> list[str]:
    """Empty netns, IPAM, cache, conf and bin dirs under `base`, a config of NETWORK whose
    host-local dataDir is the IPAM dir, and the flags that point the reaper at them."""
    dirs = {name: base / name for name in ("netns", "ipam", "cache", "conf", "bin")}
    for d in dirs.values():
        d.mkdir(parents=True)
    (dirs["cache"] / "results").mkdir()
    (dirs["ipam"] / NETWORK).mkdir()
    ipam = {"type": "host-local", "dataDir": str(dirs["ipam"]), "ranges": [[{"subnet": "10.0.0.0/8"}]]}
    conf = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{"type": "bridge", "bridge": "cni-hm0", "isGateway": True, "ipMasq": True, "ipam": ipam}],
    }
    (dirs["conf"] / f"10-{NETWORK}.conflist").write_text(json.dumps(conf))
    return [
        "--netns-dir", str(dirs["netns"]),
        "--ipam-dir", str(dirs["ipam"]),
        "--cni-cache-dir", str(dirs["cache"]),
        "--cni-conf-dir", str(dirs["conf"]),
        "--cni-bin-dir", str(dirs["bin"]),
        "--runtime-endpoint", cri,
        "--state-file", str(base / "state.json"),
    ]  # fmt: skip


_PRINTABLE = bytes(c for c in range(32, 127) if c != ord("/"))
_ANY_BYTE = bytes(c for c in range(1, 256) if c != ord("/"))


def junk_name(i: int, rng: random.Random) -> bytes:
    """A file name no runtime writes; unique by its index."""
    tag = f".{i:x}".encode()
    match i % 4:
        case 0:  # printable noise, spaces included
            body = bytes(rng.choices(_PRINTABLE, k=rng.randint(1, 60)))
        case 1:  # any byte but NUL and '/': control characters, newlines, invalid UTF-8
            body = bytes(rng.choices(_ANY_BYTE, k=rng.randint(1, 60)))
        case 2:  # as long as a name can be
            body = bytes(rng.choices(_PRINTABLE, k=255 - len(tag)))
        case _:  # near misses of the real pattern
            body = f"{NETWORK}-{rng.randbytes(31).hex()}-eth0-".encode()
    return body + tag


def lease_junk(i: int, rng: random.Random) -> bytes:
    """What a lease file never holds."""
    match i % 4:
        case 0:
            return rng.randbytes(rng.randint(1, 64))
        case 1:
            return b"not a container id!\neth0\n"
        case 2:
            return b"\n".join(rng.randbytes(16).hex().encode() for _ in range(4))
        case _:
            return rng.randbytes(32).hex().encode() + b"\n" + b"x" * 40


def fill(base: Path, count: int, rng: random.Random) -> float:
    """`count` empty files in the cache's results/ (half named as libcni names them, half junk)
    and `count` junk leases named as IPv4 addresses; returns the seconds it took."""
    t = time.perf_counter()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    results = os.open(base / "cache" / "results", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(count):
            name = f"{NETWORK}-{rng.randbytes(32).hex()}-eth0".encode() if i % 2 == 0 else junk_name(i // 2, rng)
            os.close(os.open(name, flags, 0o600, dir_fd=results))
    finally:
        os.close(results)
    leases = os.open(base / "ipam" / NETWORK, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(count):
            fd = os.open(socket.inet_ntoa((0x0A000001 + i).to_bytes(4, "big")), flags, 0o600, dir_fd=leases)
            try:
                os.write(fd, lease_junk(i, rng))
            finally:
                os.close(fd)
    finally:
        os.close(leases)
    return time.perf_counter() - t


# --------------------------------------------------------------------------- 1: one scan


def one_scan(base: Path, flags: list[str]) -> dict[str, Any]:
    """`reaper scan --json` in a netns of its own: peak RSS (wait4), wall time, output."""
    out_path, err_path = base / "scan.json", base / "scan.err"
    argv = ["unshare", "--net", "--", sys.executable, "-m", "reaper", "scan", "--json", *flags]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + SCAN_TIMEOUT
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.005)
        except BaseException:  # interrupted: the scan goes too
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4
    figures: dict[str, Any] = {
        "rss_mib": usage.ru_maxrss / 1024,
        "wall_s": wall,
        "exit": proc.returncode,
        "json_bytes": out_path.stat().st_size,
        "stderr": err_path.read_text(errors="replace").strip().splitlines()[-1:],
    }
    try:
        doc = json.loads(out_path.read_bytes())
    except ValueError:
        doc = {}
    figures["attachments"] = len(doc.get("attachments", []))
    corrupt = doc.get("corrupt", [])
    figures["corrupt_records"] = len(corrupt)  # a record may stand for many files (its count)
    figures["corrupt_files"] = sum(c.get("count", 1) for c in corrupt)
    figures["reachable"] = doc.get("runtime", {}).get("reachable")
    figures["summary"] = doc.get("summary", {})
    return figures


def scan_memory(tmp: Path, cri: str) -> None:
    print(
        "1. peak RSS and wall time of one `reaper scan --json` process (interpreter start included) with N empty "
        f"files in the cache's results/ (half `{NETWORK}-<64 hex>-eth0`, half junk names) and N junk leases in "
        f"<ipam>/{NETWORK}/, runtime: a fake CRI with no pods",
        flush=True,
    )
    rng = random.Random(1)
    rows = []
    for count in FILE_STEPS:
        base = tmp / f"scan-{count}"
        flags = node_dirs(base, cri)
        built = fill(base, count, rng)
        figures = one_scan(base, flags)
        shutil.rmtree(base)
        rows.append((count, built, figures))
    print(
        f"{'files N':>9} {'peak RSS MiB':>13} {'wall s':>7} {'JSON MiB':>9} {'attachments':>12} "
        f"{'corrupt files':>14} {'records':>8} {'exit':>5} {'runtime':>8} {'build s':>8}"
    )
    for count, built, f in rows:
        runtime = {True: "up", False: "DOWN", None: "?"}[f["reachable"]]
        print(
            f"{count:>9,} {f['rss_mib']:>13.1f} {f['wall_s']:>7.2f} {f['json_bytes'] / MIB:>9.2f} "
            f"{f['attachments']:>12,} {f['corrupt_files']:>14,} {f['corrupt_records']:>8,} {f['exit']:>5} "
            f"{runtime:>8} {built:>8.2f}"
        )
    base_rss = rows[0][2]["rss_mib"]
    for count, _, f in rows[1:]:
        extra = (f["rss_mib"] - base_rss) * MIB / (2 * count)
        print(
            f"  N={count:,}: +{f['rss_mib'] - base_rss:.1f} MiB peak RSS over N=0, {extra:,.0f} bytes for each of the "
            f"{2 * count:,} files; {f['wall_s'] - rows[0][2]['wall_s']:.2f} s more"
        )
    for count, _, f in rows:
        if f["exit"] not in (0, 1) or (count and not f["attachments"]):
            print(f"  N={count:,}: exit {f['exit']}, last stderr line: {f['stderr']}")
    print(f"  verdicts at N={rows[-1][0]:,}: {rows[-1][2]['summary']}", flush=True)


# --------------------------------------------------------------------------- 2: idle flood


def tcp_socket(source: str | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source is not None:
        sock.bind((source, 0))
    return sock


def http_get(pid: int, path: str, timeout: float = 5.0) -> tuple[int | None, float, str]:
    """(status or None, seconds from connect to the last byte, what went wrong)."""
    with in_netns(pid, tcp_socket) as sock:
        sock.settimeout(timeout)
        t = time.perf_counter()
        try:
            sock.connect(("127.0.0.1", AGENT_PORT))
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        except OSError as err:
            return None, time.perf_counter() - t, type(err).__name__
        seconds = time.perf_counter() - t
    parts = data.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None, seconds, "closed without an answer" if not data else f"bad answer {data[:40]!r}"
    return int(parts[1]), seconds, ""


def answered(result: tuple[int | None, float, str]) -> str:
    status, seconds, why = result
    return f"{status} in {seconds * 1000:.1f} ms" if status else f"no answer ({why}) after {seconds * 1000:.1f} ms"


def proc_status(pid: int) -> tuple[float, int]:
    """(VmRSS in MiB, threads)."""
    rss, threads = 0.0, 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def open_sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def connect_all(socks: list[socket.socket], address: tuple[str, int], timeout: float) -> int:
    """Connect every socket at once (non-blocking), wait until each has connected or failed;
    leave them blocking. Returns how many failed."""
    failed = 0
    pending: dict[int, socket.socket] = {}
    with selectors.DefaultSelector() as selector:
        for s in socks:
            s.setblocking(False)
            err = s.connect_ex(address)
            if err == errno.EINPROGRESS:
                pending[s.fileno()] = s
                selector.register(s, selectors.EVENT_WRITE)
            elif err:
                failed += 1
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
                s = pending.pop(key.fd)
                selector.unregister(s)
                failed += s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0
    for s in socks:
        s.setblocking(True)  # recv(MSG_DONTWAIT) then answers at once
    return failed + len(pending)


def open_flood(socks: list[socket.socket], address: tuple[str, int], timeout: float) -> tuple[int, int]:
    """Connect BATCH sockets at a time, each batch only once the agent has taken the last one
    (it keeps MAX_CONNECTIONS and closes the rest at once): a burst beyond its listen backlog
    would leave connections open on this side only (a SYN cookie's ACK dropped), never reaching
    it. Returns (failed to connect, not seen by the agent when the deadline passed)."""
    deadline = time.monotonic() + timeout
    failed = closed_before = 0
    for first in range(0, len(socks), BATCH):
        batch = socks[first : first + BATCH]
        failed += connect_all(batch, address, max(0.1, deadline - time.monotonic()))
        want = first + len(batch) - MAX_CONNECTIONS
        while (closed := closed_before + peer_closed(batch)) < want and time.monotonic() < deadline:
            time.sleep(0.002)
        closed_before = closed
    return failed, max(0, len(socks) - MAX_CONNECTIONS - closed_before)


def peer_closed(socks: list[socket.socket]) -> int:
    """How many of these connections the other end has closed (EOF or reset)."""
    closed = 0
    for s in socks:
        try:
            closed += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


def raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


@contextlib.contextmanager
def agent(tmp: Path, cri: str) -> Iterator[subprocess.Popen[bytes]]:
    """`reaper run --mode scan` in a netns of its own (loopback up), ready (first pass done)."""
    base = Path(tempfile.mkdtemp(prefix="agent-", dir=tmp))  # each agent its own dirs
    flags = node_dirs(base, cri)
    argv = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "agent", sys.executable]
    argv += ["-m", "reaper", "run", "--mode", "scan", "--listen", f"127.0.0.1:{AGENT_PORT}", "--interval", "10m"]
    argv += [*flags, "--log-format", "json"]
    with open(base / "agent.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            host = os.stat("/proc/self/ns/net").st_ino
            deadline = time.monotonic() + 60
            # Never a socket in the host's netns: wait until unshare has made the agent's.
            while os.stat(f"/proc/{proc.pid}/ns/net").st_ino == host:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"agent did not start: {(base / 'agent.log').read_text()}")
                time.sleep(0.02)
            while http_get(proc.pid, "/readyz", timeout=2)[0] != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"agent never ready: {(base / 'agent.log').read_text()}")
                time.sleep(0.2)
            yield proc
        finally:
            stop(proc)  # its exit status is then proc.returncode


def idle_flood(tmp: Path, cri: str) -> None:
    print(
        f"2. resident memory (VmRSS) of `reaper run --mode scan` (empty node, fake CRI, interval 10m) while "
        f"{FLOOD:,} TCP connections that send nothing, from {len(FLOOD_SOURCES)} addresses other than its own, are "
        f"held open to its HTTP endpoint for {HOLD:g} s, and /healthz meanwhile, from its own address",
        flush=True,
    )
    raise_nofile(FLOOD + 1024)
    with agent(tmp, cri) as proc:
        pid = proc.pid
        time.sleep(2)
        idle_rss, idle_threads = proc_status(pid)
        idle_healthz = statistics.median(http_get(pid, "/healthz")[1] for _ in range(5))

        flood = in_netns(pid, lambda: [tcp_socket(FLOOD_SOURCES[i % len(FLOOD_SOURCES)]) for i in range(FLOOD)])
        try:
            started = time.perf_counter()
            refused, unseen = open_flood(flood, ("127.0.0.1", AGENT_PORT), timeout=20)
            t0 = time.perf_counter()  # t=0: every connection of the flood is open
            opened_s = t0 - started
            first = http_get(pid, "/healthz")  # at once: the flood is all there
            tries, answered_at = 1, None if first[0] != 200 else time.perf_counter() - t0
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))
            held_rss, held_threads = proc_status(pid)
            held_sockets, held_closed = open_sockets(pid), peer_closed(flood)
            while answered_at is None and time.perf_counter() - t0 < HOLD - 0.5:
                tries += 1
                if http_get(pid, "/healthz")[0] == 200:
                    answered_at = time.perf_counter() - t0
                else:
                    time.sleep(0.25)
            time.sleep(max(0.0, HOLD - (time.perf_counter() - t0)))
            late_rss, late_threads = proc_status(pid)
            late_sockets = open_sockets(pid)
            late_closed = peer_closed(flood)
            late_healthz = http_get(pid, "/healthz")
        finally:
            for s in flood:
                s.close()
        time.sleep(2)
        after_rss, after_threads = proc_status(pid)
        after_healthz = http_get(pid, "/healthz")

    recovered = (
        f"first 200 OK at t={answered_at:.1f} s, {answered_at + opened_s:.1f} s after the flood began (try {tries})"
        if answered_at is not None
        else f"no 200 OK in {tries} tries until t={HOLD - 0.5:g} s"
    )
    rows = [
        ("idle", f"VmRSS {idle_rss:6.1f} MiB, {idle_threads:>2} threads; /healthz {idle_healthz * 1000:.1f} ms "
                 "(median of 5)"),
        ("flood opened", f"{FLOOD - refused:,} of {FLOOD:,} connected in {opened_s:.2f} s ({refused} failed), "
                         f"{BATCH} at a time, each batch accepted by the agent before the next ({unseen} never were); "
                         "t=0 once the last one is open"),
        ("flood held, t=1 s", f"VmRSS {held_rss:6.1f} MiB, {held_threads:>2} threads, sockets open in the agent: "
                              f"{held_sockets}; {held_closed:,} of the {FLOOD:,} already closed by the agent"),
        ("/healthz in the flood", f"at t=0: {answered(first)}; {recovered}"),
        (f"flood held, t={HOLD:g} s", f"VmRSS {late_rss:6.1f} MiB, {late_threads:>2} threads, sockets open in "
                                      f"the agent: {late_sockets}; {late_closed:,} closed by the agent; /healthz "
                                      f"{answered(late_healthz)}"),
        ("2 s after closing them", f"VmRSS {after_rss:6.1f} MiB, {after_threads:>2} threads; /healthz "
                                   f"{answered(after_healthz)}"),
        ("stopped", f"SIGTERM to pid {proc.pid}: exit status {proc.returncode}"),
    ]  # fmt: skip
    for label, text in rows:
        print(f"  {label + ':':<24} {text}")


def fat_headers(tmp: Path, cri: str) -> None:
    """Every slot of the agent's HTTP endpoint held by a client sending 100 header lines of
    64 KiB and reconnecting whenever closed (issue 31, point 7): its memory meanwhile."""
    print(
        f"3. resident memory of `reaper run --mode scan` while each of its {MAX_CONNECTIONS + NODE_CONNECTIONS} HTTP "
        f"slots ({MAX_CONNECTIONS} from {MAX_CONNECTIONS // PER_CLIENT} other addresses, {NODE_CONNECTIONS} from its "
        f"own) is held for {HOLD:g} s by a client sending 100 header lines of 64 KiB, reconnecting whenever closed",
        flush=True,
    )
    with agent(tmp, cri) as proc:
        pid = proc.pid
        time.sleep(2)
        idle_rss, idle_threads = proc_status(pid)
        harness = ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-m", "tests.harness.http_flood", "heads"]
        harness += ["127.0.0.1", str(AGENT_PORT), f"--seconds={HOLD}"]
        floods = []
        for sources, per_source in (
            (FLOOD_SOURCES[: MAX_CONNECTIONS // PER_CLIENT], PER_CLIENT),  # every slot of other addresses
            (["127.0.0.1"], NODE_CONNECTIONS),  # every slot of its own
        ):
            argv = [*harness, *(f"--source={a}" for a in sources), f"--per-source={per_source}"]
            floods.append(subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        peak_rss, peak_threads = idle_rss, idle_threads
        try:
            while any(flood.poll() is None for flood in floods):
                rss, threads = proc_status(pid)
                peak_rss, peak_threads = max(peak_rss, rss), max(peak_threads, threads)
                time.sleep(0.1)
            reports = [json.loads(flood.communicate()[0] or "{}") for flood in floods]
        finally:
            for flood in floods:
                if flood.poll() is None:
                    flood.kill()
                flood.wait()
        hwm = 0.0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
        after = http_get(pid, "/healthz")
    answers: dict[str, int] = {}
    for report in reports:
        for status, count in report.get("answers", {}).items():
            answers[status] = answers.get(status, 0) + count
    rows = [
        ("idle", f"VmRSS {idle_rss:6.1f} MiB, {idle_threads:>2} threads"),
        ("flood held", f"VmRSS at most {peak_rss:6.1f} MiB (sampled every 0.1 s), {peak_threads:>2} threads at most; "
                       f"VmHWM {hwm:.1f} MiB since start (its first pass included)"),
        ("flood", f"{sum(r.get('connects', 0) for r in reports):,} connections, {answers} answered, "
                  f"{sum(r.get('unanswered', 0) for r in reports):,} closed unanswered, "
                  f"{sum(r.get('sent_whole', 0) for r in reports):,} sent all 6.4 MiB"),
        ("after", f"/healthz {answered(after)}"),
        ("stopped", f"SIGTERM to pid {proc.pid}: exit status {proc.returncode}"),
    ]  # fmt: skip
    for label, text in rows:
        print(f"  {label + ':':<24} {text}")


# --------------------------------------------------------------------------- 4: address check

ADDRESS_FLOOD = ROOT / "tests" / "harness" / "address_flood.py"
ADDRESS_CHECK = """
import json, sys, time
from reaper.kinds import hostlocal
from reaper.kinds.hostlocal import HostLocalLease
from reaper.model import Attachment, AttachmentKey
from reaper.reap import addresses

addresses.unseen_processes = lambda: None  # the bench's PID namespace is the node
lease = HostLocalLease(network="net1", ip="10.9.0.5", container_id="d" * 64, ifname="eth0", path="/nonexistent",
                       data_dir="/nonexistent", mtime=0.0)
orphan = Attachment(key=AttachmentKey("d" * 64, "net1", "eth0"), resources=(hostlocal.KIND.ref(lease),), netns=None,
                    verdict="orphan", reason="", age_seconds=1e6)
started = time.perf_counter()
left = addresses.addresses_in_use([orphan], {hostlocal.KIND.identity(lease): lease}, ("/nonexistent",),
                                  deadline=600.0)
print(json.dumps({"check_s": time.perf_counter() - started, "left": list(left.values())}))
"""


def _address_check(code: Path) -> dict[str, Any]:
    """The check in a process of its own, importing `reaper` from `code`: peak RSS (wait4),
    seconds in the check, the verdict."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", ADDRESS_CHECK], cwd=code, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4
        out.seek(0)
        err.seek(0)
        printed, errors = out.read(), err.read()
    figures: dict[str, Any] = {"exit": proc.returncode, "rss_mib": usage.ru_maxrss / 1024}
    try:
        figures.update(json.loads(printed))
    except ValueError:
        figures["left"] = [" ".join(errors.decode(errors="replace").strip().splitlines()[-1:])]
    return figures


def address_check_inside(count: int, before: Path | None) -> None:
    """The rows of section 4; run inside the bench's own mount, network and PID namespace."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "unshare", "-Urn"]
    makers = [("uid 65534 (unshare -Urn)", nobody, "10.9.0.0"), ("root (unshare -n)", ["unshare", "-n"], "11.0.0.0")]
    codes = [("this tree", ROOT)] + ([("before", before)] if before is not None else [])
    print(f"{'namespace made by':<26} {'addresses':>10} {'made in s':>9} {'code':<10} {'peak RSS MiB':>12} "
          f"{'check s':>8}  verdict")  # fmt: skip
    for label, argv, first in makers:
        t = time.perf_counter()
        flood = subprocess.Popen([*argv, "python3", str(ADDRESS_FLOOD), str(count), first], stdout=subprocess.PIPE)
        try:
            assert flood.stdout is not None and flood.stdout.readline() == b"ready\n", label
            made = time.perf_counter() - t
            for name, code in codes:
                f = _address_check(code)
                verdict = f["left"][0][:110] if f["left"] else "the orphan's lease may be freed"
                check = f"{f['check_s']:>8.2f}" if "check_s" in f else f"{'-':>8}"
                print(
                    f"{label:<26} {count:>10,} {made:>9.1f} {name:<10} {f['rss_mib']:>12.1f} {check}  "
                    f"exit {f['exit']}: {verdict}",
                    flush=True,
                )
        finally:
            stop(flood)


def address_check(count: int, before: Path | None) -> None:
    print(
        f"4. the address check before a reap acts (one orphan holding 10.9.0.5), in a process of its own, beside "
        f"a network namespace of {count:,} addresses (uid 65534's holds 10.9.0.5 too)",
        flush=True,
    )
    inside = ["unshare", "--mount", "--propagation", "private", "--net", "--pid", "--fork", "--mount-proc"]
    argv = [*inside, sys.executable, "-m", "bench.hostile_memory", "--addresses-inside", str(count)]
    subprocess.run([*argv, *([str(before)] if before is not None else [])], cwd=ROOT, check=True)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--fake-cri":
        serve_fake_cri(sys.argv[2])
        return
    if len(sys.argv) >= 3 and sys.argv[1] == "--addresses-inside":
        address_check_inside(int(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
        return
    if len(sys.argv) >= 2 and sys.argv[1] == "--addresses":
        rest = sys.argv[2:]
        before = Path(rest[rest.index("--before") + 1]).resolve() if "--before" in rest else None
        counts = [int(a) for a in rest if a.isdigit()]
        address_check(counts[0] if counts else 1_000_000, before)
        return
    if os.geteuid() != 0:
        sys.exit("run as root: it makes network namespaces")
    tmp = Path(tempfile.mkdtemp(prefix="reaper-hostile-"))
    try:
        with fake_cri(tmp) as cri:
            scan_memory(tmp, cri)
            print(flush=True)
            idle_flood(tmp, cri)
            print(flush=True)
            fat_headers(tmp, cri)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(flush=True)
    address_check(1_000_000, None)


if __name__ == "__main__":
    main()
