"""A real systemd, booted by systemd-nspawn on the debootstrap tree, for the README's install.

The tree is the image test's cached bookworm (tests/harness/debian_base.py) under a second
cached layer: systemd and the tools the agent and the plugins' DEL run (iptables, nftables,
iproute2), and nothing of the reaper's: a stock node, where the test runs the README's install
(`BootedNode.sh`). The node has no route to a package index (it is in the lab's netns), so pip
there reads a wheelhouse instead, cached too: the project's dependencies and build requirements
as bookworm's pip downloads them, lent read-only at /run/wheelhouse (`PIP_NO_INDEX`,
`PIP_FIND_LINKS`: what a site's own mirror would be). The caches are read-only lower layers of an
overlay; what a boot writes lands in the test's own upper dir. The overlay is mounted in a mount
namespace of the test's own that dies with the container, so nothing is left mounted on the host
whatever happens.

The container shares the lab's netns (`--network-namespace-path`), so the units' reaper sees the
lab's links and chains as a node's would, and gets the lab's dir bound in at the same path (its
runtime socket, netns pins, IPAM, cache, config and bin dirs).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.harness import debian_base
from tests.harness.lab import kernel

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("systemd", "systemd-sysv", "iptables", "nftables", "iproute2")
VENV = "/opt/cni-reaper"  # where the README's install puts the reaper
WHEELHOUSE = "/run/wheelhouse"  # the wheelhouse's path in the container
# What a root login on the node has: the README's commands run with this and nothing of the test's.
NODE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "PIP_NO_INDEX": "1",
    "PIP_FIND_LINKS": WHEELHOUSE,
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}
# Left out of the checkout the node gets: the host's venv, caches and build output.
CHECKOUT_JUNK = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".coverage", ".hypothesis")
NSPAWN = ("systemd-nspawn", "--register=no", "--keep-unit", "--quiet")
CA_CERTS = Path("/etc/ssl/certs")
PIP_CONF = Path("/etc/pip.conf")


class NspawnError(Exception):
    pass


# What the README's systemd install reads: the locked dependencies and build backend.
INSTALL_LOCKS = ("requirements/runtime.lock", "requirements/build.lock")


def install_locks() -> list[str]:
    """The text of each lock the install reads (the wheelhouse's cache key)."""
    return [(ROOT / lock).read_text() for lock in INSTALL_LOCKS]


def _lend_pip() -> list[str]:
    """nspawn flags that let pip inside reach the index as the host's does: the CA bundle over
    the tree's own (a dir it has), the site pip config on /run (a tmpfs in the container)."""
    flags = [f"--bind-ro={CA_CERTS}"] if CA_CERTS.is_dir() else []
    if PIP_CONF.is_file():
        flags += [f"--bind-ro={PIP_CONF}:/run/host-pip.conf", "--setenv=PIP_CONFIG_FILE=/run/host-pip.conf"]
    return flags


def _in_overlay(lower: Sequence[Path], upper: Path, work: Path, merged: Path, commands: Sequence[Sequence[str]]) -> str:
    """A shell script: a private mount namespace's overlay of `lower` at `merged`, then the
    commands, the last one exec'd (so its pid is the script's)."""
    options = f"lowerdir={':'.join(str(p) for p in lower)},upperdir={upper},workdir={work}"
    lines = [
        "set -e",
        "mount --make-private /",
        f"mount -t overlay cni-reaper-nspawn -o {shlex.quote(options)} {shlex.quote(str(merged))}",
    ]
    *first, last = commands
    lines += [shlex.join(c) for c in first]
    lines.append("exec " + shlex.join(last))
    return "\n".join(lines)


def _private(script: str) -> list[str]:
    return ["unshare", "--mount", "--propagation", "unchanged", "sh", "-c", script]


def _in_base(base: Path, upper: Path, script: str, binds: Sequence[str] = ()) -> None:
    """`script` run by nspawn (the host's network, pip lent) on an overlay of `base` whose upper
    dir is `upper`; the overlay's work and mount dirs are made beside `upper` and removed."""
    work, merged = upper.parent / "work", upper.parent / "merged"
    work.mkdir()
    merged.mkdir()
    nspawn = [*NSPAWN, "-D", str(merged), "--pipe", *_lend_pip(), *binds, "--", "/bin/sh", "-c", script]
    proc = subprocess.run(
        _private(_in_overlay([base], upper, work, merged, [nspawn])),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    shutil.rmtree(work)
    merged.rmdir()
    if proc.returncode != 0:
        raise NspawnError(f"{script[:80]}... failed: {(proc.stdout + proc.stderr)[-3000:]}")


def _build_layer(base: Path, layer: Path) -> None:
    """`layer` (an overlay upper dir over `base`): systemd and the tools, no reaper."""
    _in_base(
        base,
        layer,
        "apt-get update -qq"
        f" && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {' '.join(PACKAGES)}"
        " && rm -rf /var/lib/apt/lists/*",
    )


def _download_wheels(base: Path, wheelhouse: Path) -> None:
    """Into `wheelhouse`: every wheel the README's install takes from the locks, by bookworm's
    own pip (so the wheels are the ones for its Python and architecture), each checked by its
    hash. The overlay's upper is thrown away."""
    locks = " ".join(f"-r /checkout/{lock}" for lock in INSTALL_LOCKS)
    scratch = wheelhouse.parent / "scratch"
    scratch.mkdir()
    try:
        _in_base(
            base,
            scratch,
            f"python3 -m pip download -q --no-cache-dir --require-hashes --only-binary=:all: -d /wheelhouse {locks}",
            binds=[f"--bind={wheelhouse}:/wheelhouse", f"--bind-ro={ROOT / 'requirements'}:/checkout/requirements"],
        )
    finally:
        shutil.rmtree(scratch)


def systemd_layers() -> list[Path]:
    """The overlay's lower dirs, top first: the systemd layer, then the base tree."""
    base = debian_base.bookworm_python()
    inputs = {
        "base": base.key,
        "packages": list(PACKAGES),
        "nspawn": debian_base._tool_version("systemd-container"),
    }
    # Not "bookworm-systemd", the name of the layer that held a preinstalled venv: a cache name's
    # other keys are removed as stale, and checkouts from before would keep rebuilding it.
    layer = debian_base.cached_tree("bookworm-systemd-stock", inputs, lambda upper: _build_layer(base.rootfs, upper))
    return [layer.rootfs, base.rootfs]


def wheelhouse() -> Path:
    """The cached wheelhouse (a dir of wheels) for this checkout's dependencies."""
    base = debian_base.bookworm_python()
    inputs = {
        "base": base.key,
        "locks": install_locks(),
        "nspawn": debian_base._tool_version("systemd-container"),
    }
    return debian_base.cached_tree(
        "bookworm-wheelhouse", inputs, lambda dest: _download_wheels(base.rootfs, dest)
    ).rootfs


def copy_checkout(dest: Path) -> None:
    """This checkout's files at `dest`, as a `git clone` would have them (no venv or caches)."""
    shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(*CHECKOUT_JUNK))


class BootedNode:
    """systemd booted in a container on the overlay, in `netns`, with `binds` at the same paths.

    Files put under `upper` before `boot()` are in the container's tree from the start (units,
    drop-ins); what the container writes shows there too.
    """

    def __init__(self, work: Path, netns: Path, binds: Sequence[Path], ro_binds: Sequence[Path]) -> None:
        self.work = work
        self.upper, self._work, self.merged = work / "upper", work / "work", work / "merged"
        for d in (self.upper, self._work, self.merged):
            d.mkdir(parents=True)
        self.netns = netns
        self.binds = list(binds)
        self.ro_binds = list(ro_binds)
        self.machine = f"cni-reaper-{os.getpid()}"
        self.log = work / "nspawn.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def boot(self, timeout: float = 120) -> None:
        lower = systemd_layers()
        wheels = wheelhouse()
        boot = [
            *NSPAWN, "-D", str(self.merged), "--boot", f"--machine={self.machine}", "--console=passive",
            "--capability=all",  # a node's systemd holds every capability; the units' own limits apply
            f"--network-namespace-path={self.netns}",
            *(f"--bind={p}" for p in self.binds), *(f"--bind-ro={p}" for p in self.ro_binds),
            f"--bind-ro={wheels}:{WHEELHOUSE}",
        ]  # fmt: skip
        script = _in_overlay(lower, self.upper, self._work, self.merged, [boot])
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(_private(script), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        state = "no container yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NspawnError(f"nspawn exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            if self.init_pid() is not None:
                # Up once systemd has finished booting; "degraded" when some unit failed (a
                # container lacks what a few of Debian's units want), which the test checks.
                answer = self.run("systemctl", "is-system-running", check=False)
                state = (answer.stdout + answer.stderr).strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.3)
        raise NspawnError(f"systemd not up after {timeout}s ({state}): {self.log.read_text()[-3000:]}")

    def init_pid(self) -> int | None:
        """The container's PID 1, as the host sees it: nspawn's child running systemd."""
        if self.proc is None:
            return None
        for pid in kernel.pids():
            if kernel.parent_pid(pid) == self.proc.pid and kernel.read_cmdline(pid)[:1] in (
                ["/sbin/init"],
                ["/lib/systemd/systemd"],
                ["/usr/lib/systemd/systemd"],
            ):
                return pid
        return None

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A command inside the container (its mount, PID, UTS, IPC and net namespaces)."""
        pid = self.init_pid()
        if pid is None:
            raise NspawnError("the container is not running")
        nsenter = ["nsenter", f"--target={pid}", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]
        proc = subprocess.run([*nsenter, *argv], capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise NspawnError(f"{' '.join(argv)}: {(proc.stdout + proc.stderr)[-2000:]}")
        return proc

    def sh(self, script: str, cwd: str = "/", timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`script` run by `sh -eu` in the container from `cwd`, as root with a login's environment
        (NODE_ENV) and nothing of the test's; it stops at the first command that fails."""
        env = ["env", "-i", *(f"{k}={v}" for k, v in NODE_ENV.items())]
        return self.run(*env, "sh", "-euc", f"cd {shlex.quote(cwd)}\n{script}", check=False, timeout=timeout)

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in properties)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def poweroff(self, timeout: float = 60) -> int:
        """SIGTERM to nspawn: it asks the container's systemd to power off; SIGKILL if that hangs."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pid = self.init_pid()
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)  # the PID namespace's init: all of it goes
                proc.kill()
                proc.wait(timeout)
        return proc.returncode

    def close(self) -> None:
        self.poweroff()
        shutil.rmtree(self.work, ignore_errors=True)
