"""A Debian bookworm root filesystem made by debootstrap, cached between test runs.

No image can be pulled here, so the image test stands this tree in for the Dockerfile's
python:3.11-slim-bookworm base, and the systemd test boots a copy of it. It is made once (about
a minute) and kept under CACHE_ROOT, which survives between runs; its key is a hash of
everything that shapes it (suite, mirror, packages, the tweaks below, debootstrap's version),
so a change to any of them builds a new one and removes the old. A tree older than MAX_AGE is
rebuilt too, so it does not drift from the archive the image build installs from.

A tree in the cache is never modified after it is complete: users copy it or lay an overlay on
it. Concurrent test runs wait for each other on a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

CACHE_ROOT = Path("/var/cache/cni-reaper-tests")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python3-pip")
MAX_AGE = 30 * 24 * 3600.0
# Bump when the tweaks in _finish change what the tree holds.
_FORMAT = "2"
# The python image's apt sources: the release, its updates and security, so `apt-get install`
# of the Dockerfile's pinned versions resolves as it does on that base.
_SOURCES = f"""Types: deb
URIs: {MIRROR}
Suites: {SUITE} {SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: {SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
# What Debian's container images (and so python:*-slim-bookworm) configure and a debootstrap
# tree lacks: apt keeps no package cache or .deb files in a layer, and dpkg leaves out the
# documentation, man pages and translations. Without them the image's apt layer would be about
# 90 MB heavier than on the real base.
_APT_CLEAN = "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"
_APT_CONF = f"""// As in Debian's container images: no caches in image layers.
DPkg::Post-Invoke {{ "{_APT_CLEAN}"; }};
APT::Update::Post-Invoke {{ "{_APT_CLEAN}"; }};
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
Acquire::GzipIndexes "true";
Apt::AutoRemove::SuggestsImportant "false";
"""
_DPKG_EXCLUDES = """# As in Debian's slim container images.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
"""


class DebianBaseError(Exception):
    pass


@dataclass(frozen=True)
class CachedTree:
    key: str
    rootfs: Path  # complete and read-only by convention: copy it or lay an overlay on it


def _tool_version(package: str) -> str:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def cache_key(name: str, inputs: object) -> str:
    blob = json.dumps({"name": name, "format": _FORMAT, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    fd = os.open(CACHE_ROOT / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fresh(done: Path) -> bool:
    try:
        return time.time() - done.stat().st_mtime < MAX_AGE
    except FileNotFoundError:
        return False


def cached_tree(name: str, inputs: object, build: Callable[[Path], None]) -> CachedTree:
    """The tree `name` for `inputs`, built by `build(rootfs)` unless a fresh one is cached.
    Trees of the same name with another key are stale and removed."""
    key = cache_key(name, inputs)
    home = CACHE_ROOT / name
    entry = home / key
    done = entry / "complete"
    with cache_lock():
        if not _fresh(done):
            home.mkdir(parents=True, exist_ok=True)
            for old in home.iterdir():
                shutil.rmtree(old)  # stale keys, an expired tree, or a build cut short
            partial = home / f".{key}.partial"
            try:
                (partial / "rootfs").mkdir(parents=True)
                build(partial / "rootfs")
                (partial / "inputs.json").write_text(json.dumps(inputs, indent=1, sort_keys=True))
                (partial / "complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
                partial.rename(entry)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
    return CachedTree(key, entry / "rootfs")


def _run(argv: Sequence[str], timeout: float) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise DebianBaseError(f"{' '.join(argv)} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")


def _debootstrap(rootfs: Path) -> None:
    _run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), MIRROR],
        timeout=1200,
    )
    _finish(rootfs)


def _finish(rootfs: Path) -> None:
    """What makes the tree stand in for python:3.11-slim-bookworm: `python` on PATH (the
    Dockerfile runs `python -m pip` and `python -m venv`), the image's apt sources and apt/dpkg
    settings, and no apt lists or package cache (the Dockerfile runs apt-get update itself)."""
    python = rootfs / "usr" / "local" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.symlink_to("/usr/bin/python3")
    (rootfs / "etc" / "apt" / "sources.list").unlink(missing_ok=True)
    (rootfs / "etc" / "apt" / "sources.list.d" / "debian.sources").write_text(_SOURCES)
    (rootfs / "etc" / "apt" / "apt.conf.d" / "docker-clean").write_text(_APT_CONF)
    (rootfs / "etc" / "dpkg" / "dpkg.cfg.d" / "docker").write_text(_DPKG_EXCLUDES)
    for junk in ("var/lib/apt/lists", "var/cache/apt/archives", "var/cache/apt"):
        for child in (rootfs / junk).iterdir():
            if child.is_file() and child.name != "lock":
                child.unlink()
    # The machine that made it, not the one that runs it.
    for machine in ("etc/hostname", "etc/machine-id"):
        path = rootfs / machine
        if path.exists():
            path.write_text("")


def bookworm_python() -> CachedTree:
    """Debian bookworm minbase with python3, venv and pip, `python` on PATH."""
    inputs = {
        "suite": SUITE,
        "mirror": MIRROR,
        "variant": "minbase",
        "packages": list(PACKAGES),
        "sources": _SOURCES,
        "apt": _APT_CONF,
        "dpkg": _DPKG_EXCLUDES,
        "debootstrap": _tool_version("debootstrap"),
    }
    return cached_tree("bookworm-python", inputs, _debootstrap)
