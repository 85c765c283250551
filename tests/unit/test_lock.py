"""The lock and pyproject.toml agree: every package pyproject names (runtime, test extra, build
backend) is pinned in the lock within pyproject's range, everything the lock pins because
pyproject asks for it is named there, each pin carries hashes, and the three locks pin one set
of versions. Everything that installs Python packages installs them from a lock, hashes required."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_FROM_PYPROJECT = "cni-reaper (pyproject.toml)"


class Pin:
    def __init__(self, *, version: str, hashes: int, via: list[str]) -> None:
        self.version = Version(version)
        self.hashes = hashes
        self.via = via


def parse_lock(text: str) -> dict[str, Pin]:
    """name -> pin of a `uv pip compile --generate-hashes` output."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    in_via = False
    for line in text.splitlines():
        found = _PIN.match(line)
        if found:
            current = Pin(version=found[2], hashes=0, via=[])
            pins[canonicalize_name(found[1])] = current
            in_via = False
            continue
        stripped = line.strip()
        if current is None:
            continue
        if stripped.startswith("--hash=sha256:"):
            current.hashes += 1
        elif stripped == "# via":
            in_via = True
        elif stripped.startswith("# via "):
            current.via.append(stripped[len("# via ") :])
        elif in_via and stripped.startswith("#   "):
            current.via.append(stripped[len("#   ") :])
    return pins


def lock(name: str) -> dict[str, Pin]:
    return parse_lock((LOCKS / name).read_text())


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def runtime_requirements() -> list[Requirement]:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    return [Requirement(r) for r in project["dependencies"]]


def extra_requirements() -> list[Requirement]:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    return [Requirement(r) for r in project["optional-dependencies"]["test"]]


def build_requirements() -> list[Requirement]:
    build = _pyproject()["build-system"]
    assert isinstance(build, dict)
    return [Requirement(r) for r in build["requires"]]


def _missing_or_outside(requirements: list[Requirement], pins: dict[str, Pin]) -> list[str]:
    wrong = []
    for req in requirements:
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            wrong.append(f"{req} is not in the lock")
        elif not req.specifier.contains(pin.version, prereleases=True):
            wrong.append(f"{req} but the lock pins {pin.version}")
    return wrong


def test_every_package_pyproject_names_is_locked_within_its_range() -> None:
    assert _missing_or_outside([*runtime_requirements(), *extra_requirements()], lock("test.lock")) == []
    assert _missing_or_outside(runtime_requirements(), lock("runtime.lock")) == []
    assert _missing_or_outside(build_requirements(), lock("build.lock")) == []
    assert _missing_or_outside(build_requirements(), lock("test.lock")) == []


def test_what_the_lock_pins_for_pyproject_pyproject_names() -> None:
    named = {canonicalize_name(r.name) for r in [*runtime_requirements(), *extra_requirements()]}
    asked = {name for name, pin in lock("test.lock").items() if _FROM_PYPROJECT in pin.via}
    assert asked == named
    runtime_named = {canonicalize_name(r.name) for r in runtime_requirements()}
    runtime_asked = {name for name, pin in lock("runtime.lock").items() if _FROM_PYPROJECT in pin.via}
    assert runtime_asked == runtime_named


@pytest.mark.parametrize("name", ["test.lock", "runtime.lock", "build.lock"])
def test_every_pin_carries_hashes(name: str) -> None:
    pins = lock(name)
    assert pins
    assert [n for n, pin in pins.items() if pin.hashes == 0] == []


def test_the_locks_pin_one_set_of_versions() -> None:
    full = lock("test.lock")
    for name in ("runtime.lock", "build.lock"):
        differ = {
            n: (str(p.version), full.get(n))
            for n, p in lock(name).items()
            if n not in full or full[n].version != p.version
        }
        assert differ == {}, f"{name} pins what test.lock does not"


def test_parse_lock_reads_pins_hashes_and_via() -> None:
    text = (
        "foo==1.2 ; sys_platform != 'win32' \\\n"
        "    --hash=sha256:aa \\\n"
        "    --hash=sha256:bb\n"
        "    # via\n"
        "    #   cni-reaper (pyproject.toml)\n"
        "    #   bar\n"
        "bar==2.0 \\\n"
        "    --hash=sha256:cc\n"
        "    # via cni-reaper (pyproject.toml)\n"
    )
    pins = parse_lock(text)
    assert pins["foo"].version == Version("1.2") and pins["foo"].hashes == 2
    assert pins["foo"].via == [_FROM_PYPROJECT, "bar"]
    assert pins["bar"].via == [_FROM_PYPROJECT]
    assert _missing_or_outside([Requirement("foo>=2")], pins) == ["foo>=2 but the lock pins 1.2"]
    assert _missing_or_outside([Requirement("baz")], pins) == ["baz is not in the lock"]


def test_every_install_reads_a_lock_with_hashes_required() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q --require-hashes -r requirements/test.lock" in makefile
    assert "--no-build-isolation -e ." in makefile
    assert re.search(r"^\$\(VENV\)/\.installed: requirements/test\.lock$", makefile, re.M)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes --only-binary=:all: -r requirements/runtime.lock" in dockerfile
    assert "--require-hashes --only-binary=:all: -r requirements/build.lock" in dockerfile
    assert "--no-build-isolation" in dockerfile
    # No other pip install of a name or of the project with its dependencies.
    for line in dockerfile.splitlines():
        if "pip install" in line:
            assert "--require-hashes" in line or "--no-deps" in line, line
