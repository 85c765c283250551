"""image/apt-snapshot.sh: which state of the Debian archive the image's `apt-get install` reads.

Run with Debian's own awk (mawk, as in the base image) on the apt sources Debian's container
images carry: debuerreotype writes the snapshot the image was built from as a comment above
each URIs line. `pin` and `record` run on files under tmp_path, with dpkg-query from this
machine; the image test runs them in a real build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "image" / "apt-snapshot.sh"
STAMP = "20261006T000000Z"
# /etc/apt/sources.list.d/debian.sources of debian:bookworm-slim (and so python:*-slim-bookworm).
BASE_SOURCES = f"""Types: deb
# http://snapshot.debian.org/archive/debian/{STAMP}
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/{STAMP}
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
# What a debootstrap tree (the tests' stand-in base) has: no snapshot named.
BARE_SOURCES = "\n".join(line for line in BASE_SOURCES.splitlines() if not line.startswith("#")) + "\n"


def run(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), *args], input=stdin, capture_output=True, text=True, timeout=30, env=env, check=False
    )


def uris(text: str) -> list[str]:
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("URIs:")]


def test_base_reads_each_archive_snapshot_from_the_base_sources() -> None:
    out = run("sources", "base", stdin=BASE_SOURCES)
    assert out.returncode == 0, out.stderr
    assert uris(out.stdout) == [
        f"http://snapshot.debian.org/archive/debian/{STAMP}",
        f"http://snapshot.debian.org/archive/debian-security/{STAMP}",
    ]
    # Only the URIs lines change: suites, keys and the comments stay.
    assert [line for line in out.stdout.splitlines() if not line.startswith("URIs:")] == [
        line for line in BASE_SOURCES.splitlines() if not line.startswith("URIs:")
    ]


def test_a_snapshot_time_points_every_archive_at_that_snapshot() -> None:
    out = run("sources", "20261201T120000Z", stdin=BASE_SOURCES)
    assert out.returncode == 0, out.stderr
    assert uris(out.stdout) == [
        "http://snapshot.debian.org/archive/debian/20261201T120000Z",
        "http://snapshot.debian.org/archive/debian-security/20261201T120000Z",
    ]
    # Also on a base that names none: the time given is the snapshot.
    assert uris(run("sources", "20261201T120000Z", stdin=BARE_SOURCES).stdout) == uris(out.stdout)


def test_live_leaves_the_sources_as_they_are() -> None:
    for sources in (BASE_SOURCES, BARE_SOURCES):
        out = run("sources", "live", stdin=sources)
        assert out.returncode == 0 and out.stdout == sources


def test_base_on_a_base_that_names_no_snapshot_stops_the_build() -> None:
    # Falling back to the live mirror would build other versions from the same digest: refuse.
    out = run("sources", "base", stdin=BARE_SOURCES)
    assert out.returncode == 3
    assert "names no snapshot for http://deb.debian.org/debian http://deb.debian.org/debian-security" in out.stderr
    assert "DEBIAN_SNAPSHOT" in out.stderr
    # A snapshot comment holds for its own stanza only, not for the next one.
    half = BASE_SOURCES.replace(f"# http://snapshot.debian.org/archive/debian-security/{STAMP}\n", "")
    out = run("sources", "base", stdin=half)
    assert out.returncode == 3 and "for http://deb.debian.org/debian-security;" in out.stderr


@pytest.mark.parametrize("snapshot", ["", "latest", "2026-10-06", "20261006", "20261006T000000", "base; rm -rf /"])
def test_anything_else_is_refused(snapshot: str) -> None:
    out = run("sources", snapshot, stdin=BASE_SOURCES)
    assert out.returncode == 2 and out.stdout == ""
    assert "is not base, live or a snapshot time" in out.stderr


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg-query (a Debian machine)")
def test_pin_then_record_leaves_the_base_sources_and_a_manifest(tmp_path: Path) -> None:
    sources = tmp_path / "debian.sources"
    sources.write_text(BASE_SOURCES)
    conf = tmp_path / "99snapshot"
    env = {
        **os.environ,
        "APT_SNAPSHOT_SOURCES": str(sources),
        "APT_SNAPSHOT_SAVED": str(tmp_path / "saved"),
        "APT_SNAPSHOT_CONF": str(conf),
    }
    pinned = run("pin", "base", env=env)
    assert pinned.returncode == 0, pinned.stderr
    assert uris(sources.read_text())[0] == f"http://snapshot.debian.org/archive/debian/{STAMP}"
    assert 'Acquire::Check-Valid-Until "false";' in conf.read_text()  # a snapshot's Release is expired

    manifest = tmp_path / "share" / "debian-packages.txt"
    recorded = run("record", str(manifest), env=env)
    assert recorded.returncode == 0, recorded.stderr
    # The image keeps the base's sources and apt settings; the manifest says where the packages
    # came from and every version.
    assert sources.read_text() == BASE_SOURCES and not conf.exists() and not (tmp_path / "saved").exists()
    lines = manifest.read_text().splitlines()
    assert f"#   http://snapshot.debian.org/archive/debian-security/{STAMP}" in lines
    packages = [line for line in lines if not line.startswith("#")]
    assert packages == sorted(packages) and all(p.count("=") == 1 for p in packages)
    versions = dict(p.split("=") for p in packages)
    assert (
        versions["dpkg"]
        == subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "dpkg"], capture_output=True, text=True, check=True
        ).stdout
    )
