"""The reads churn races, each for a while under the churn that makes it fail:

1. the address check a reap makes before acting (`reaper.reap.addresses.addresses_in_use`, the
   real walks and reads, one orphan holding an address no namespace has) in a loop, beside PINS
   pin paths in a netns dir of the bench's own each churned by a shell loop (pin made with
   `unshare --net=PATH`, an address configured in it, pin unmounted and removed, again): the
   passes, the namespaces the checks left unread by error and by how they were found, the checks
   that could not list every namespace, and the passes that left the orphan;
2. the mount walk (`reaper.host.nsmounts.held_mounts`) in a loop beside `unshare -m sleep 0.01`
   in a shell loop (a task of a mount namespace of its own exiting mid-walk): walks and failures.

Run as root: `.venv/bin/python -m bench.churn_reads [SECONDS] [--pins N] [--tree DIR]` (SECONDS
for each part, default 30 or CHURN_READS_SECONDS; 4 pins). `--tree DIR`: the same with the
`reaper` package of DIR (as `git archive <rev> reaper | tar -x -C DIR` leaves it), in a process
of its own. In the host's mount and network namespace, as a runtime's pins are, but every pin in
a temporary dir of its own (never /run/netns); the shell loops are stopped by their process
group and every pin left is unmounted and removed at the end. Prints the figures.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import reaper
from bench.orphans import orphan_leasing
from reaper.host.nsmounts import held_mounts
from reaper.kinds import hostlocal
from reaper.reap import addresses

ROOT = Path(__file__).resolve().parent.parent
ORPHAN_ADDRESS = "10.250.1.1"  # the orphan's lease: configured in no namespace
PIN_ADDRESS = "10.250.0.{}"  # configured in each churned pin's namespace, one a pin path
UMOUNT_TRIES = 8

# $1 the pin path, $2 the address; a dot a cycle, to count them. Unmounted lazily (MNT_DETACH), as
# containerd and the CNI plugins' own tests remove a pin: the check may hold an fd on it.
CHURN_PIN = """
while :; do
  : > "$1" || continue
  unshare --net="$1" sh -c 'ip link set lo up && ip addr add "$0"/32 dev lo' "$2"
  umount -l "$1"
  rm -f "$1"
  printf .
done
"""
CHURN_MOUNT_NS = """
while :; do
  unshare -m sleep 0.01
  printf .
done
"""
# The text of each errno, longest first, so that a text naming one starts with it.
STRERRORS = tuple(
    sorted(((os.strerror(code), name) for code, name in errno.errorcode.items()), key=lambda t: -len(t[0]))
)
FOUND_THROUGH = (
    ("the netns pinned at", "a pin"),
    ("the netns of pid", "processes"),
    ("the netns held by", "a mount"),
    ("the netns the reaper runs in", "its own"),
)


def error_name(text: str) -> str:
    """The errno name a read's error text starts with (`describe_oserror` keeps only strerror),
    else the text up to its first colon."""
    for strerror, name in STRERRORS:
        if text.startswith(strerror):
            return name
    return text.split(":", 1)[0][:60]


def found_through(where: str) -> str:
    """How the check found a namespace, from the text it names it by."""
    return next((how for prefix, how in FOUND_THROUGH if where.startswith(prefix)), where[:40])


@contextmanager
def shell_loop(script: str, args: list[str], dots: Path) -> Iterator[None]:
    """`script` run by sh in a process group of its own, its dots written to `dots`; stopped by
    that group (its pid) and waited for at the end."""
    with dots.open("wb") as out, (dots.parent / f"{dots.name}.err").open("wb") as err:
        proc = subprocess.Popen(["sh", "-c", script, "sh", *args], stdout=out, stderr=err, start_new_session=True)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cycles(dots: Path) -> int:
    return dots.stat().st_size if dots.exists() else 0


def remove_pin(path: Path) -> None:
    """Unmount whatever a stopped loop left on `path`, then remove it."""
    for _ in range(UMOUNT_TRIES):
        if not os.path.ismount(path):
            break
        subprocess.run(["umount", "-l", str(path)], stderr=subprocess.DEVNULL)
    path.unlink(missing_ok=True)


def address_checks(netns_dir: Path, logs: Path, seconds: float, pins: int) -> list[str]:
    """Part 1: the check in a loop for `seconds` beside `pins` churned pin paths; its lines."""
    orphan, lease = orphan_leasing(ORPHAN_ADDRESS, "c" * 64)
    records = {hostlocal.KIND.identity(lease): lease}
    paths = [netns_dir / f"churn-{i}" for i in range(pins)]
    dots = [logs / f"pin-{i}" for i in range(pins)]
    unread: Counter[tuple[str, str]] = Counter()
    unseen: Counter[str] = Counter()
    passes = read = left = 0
    try:
        with ExitStack() as stack:
            verdict = stack.enter_context(
                mock.patch.object(addresses, "leave_for_addresses", wraps=addresses.leave_for_addresses)
            )
            for i, (path, dot) in enumerate(zip(paths, dots, strict=True)):
                stack.enter_context(shell_loop(CHURN_PIN, [str(path), PIN_ADDRESS.format(i + 1)], dot))
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                left += bool(addresses.addresses_in_use([orphan], records, (str(netns_dir),)))
                seen, why_unseen = verdict.call_args.args[1:3]
                passes += 1
                read += len(seen)
                if why_unseen is not None:
                    unseen[why_unseen.split(":", 1)[0]] += 1
                for ns in seen:
                    if ns.error is not None:
                        unread[error_name(ns.error), found_through(ns.where)] += 1
    finally:
        for path in paths:
            remove_pin(path)
    made = sum(cycles(d) for d in dots)
    lines = [
        f"1. the address check, {seconds:.0f} s beside {pins} pin paths churned in {netns_dir} ({made:,} pins made"
        f" and removed)",
        f"   passes: {passes:,}, namespaces read a pass: {read / max(passes, 1):.1f}, passes that left the orphan:"
        f" {left:,}",
        f"   namespaces left unread: {sum(unread.values()):,}"
        + "".join(f"; {name} {n:,}" for name, n in Counter(name for name, _ in unread.elements()).most_common()),
    ]
    lines += [f"     {name} (found through {how}): {n:,}" for (name, how), n in unread.most_common()]
    lines.append(f"   checks that could not see every namespace: {sum(unseen.values()):,}")
    lines += [f"     {why}: {n:,}" for why, n in unseen.most_common()]
    lines += _loop_errors(dots)
    return lines


def mount_walks(netns_dir: Path, logs: Path, seconds: float) -> list[str]:
    """Part 2: the mount walk in a loop for `seconds` beside `unshare -m sleep 0.01` in a loop; its lines."""
    failures: Counter[str] = Counter()
    first: dict[str, str] = {}
    walks = 0
    dots = logs / "unshare-m"
    with shell_loop(CHURN_MOUNT_NS, [], dots):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            walks += 1
            try:
                held_mounts((str(netns_dir),))
            except OSError as err:
                name = errno.errorcode.get(err.errno or 0, str(err.errno))
                failures[name] += 1
                first.setdefault(name, str(err)[:160])
    lines = [
        f"2. the mount walk, {seconds:.0f} s beside `unshare -m sleep 0.01` in a loop ({cycles(dots):,} runs)",
        f"   walks: {walks:,}, walk failures: {sum(failures.values()):,}",
    ]
    lines += [f"     {name} {n:,}, the first: {first[name]}" for name, n in failures.most_common()]
    return lines + _loop_errors([dots])


def _loop_errors(dots: list[Path]) -> list[str]:
    """What the shell loops wrote to stderr, if anything: lines and the first one."""
    texts = [t for d in dots if (t := (d.parent / f"{d.name}.err").read_text(errors="replace").strip())]
    if not texts:
        return []
    count = sum(len(t.splitlines()) for t in texts)
    return [f"   the churn loops' stderr: {count:,} lines, the first: {texts[0].splitlines()[0][:160]}"]


def measure(seconds: float, pins: int) -> None:
    print(f"reaper from {Path(reaper.__file__).parent}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="reaper-churn-reads-"))
    netns_dir, logs = work / "netns", work / "logs"
    netns_dir.mkdir()
    logs.mkdir()
    try:
        print("\n".join(address_checks(netns_dir, logs, seconds, pins)), flush=True)
        print("\n".join(mount_walks(netns_dir, logs, seconds)), flush=True)
    finally:
        for path in netns_dir.iterdir():
            remove_pin(path)
        shutil.rmtree(work)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.churn_reads", description=__doc__.split("\n\n")[0])
    parser.add_argument("seconds", nargs="?", type=float, default=float(os.environ.get("CHURN_READS_SECONDS", "30")))
    parser.add_argument("--pins", type=int, default=4)
    parser.add_argument("--tree", type=Path, help="a dir holding the reaper package to measure")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: it makes network namespaces and mounts")
    if args.tree is None:
        measure(args.seconds, args.pins)
        return
    tree = args.tree.resolve()
    env = {**os.environ, "PYTHONPATH": f"{tree}:{ROOT}"}
    argv = [sys.executable, "-m", "bench.churn_reads", str(args.seconds), "--pins", str(args.pins)]
    sys.exit(subprocess.run(argv, cwd=tree, env=env).returncode)


if __name__ == "__main__":
    main()
