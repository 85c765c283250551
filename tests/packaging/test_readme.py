"""The README as its reader meets it: the first screen leads to production in the order a safe
rollout takes, and every link within it, or to a file beside it, goes somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "DEVELOPMENT.md", "COMPATIBILITY.md", "SECURITY.md", "bench/README.md")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_every_link_within_the_docs_goes_somewhere() -> None:
    for doc in DOCS:
        path = ROOT / doc
        text = path.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.exists(), f"{doc}: {target}"
            if anchor:
                assert anchor in anchors(linked.read_text()), f"{doc}: {target}"


def test_the_first_screen_is_what_it_does_the_demo_and_the_path_to_production() -> None:
    text = (ROOT / "README.md").read_text()
    first = text[: text.index("## What it does")]
    assert len(first.splitlines()) < 60, "the first screen fits a screen or two"
    assert "make demo" in first and "make test" in first and "not a production node" in first
    steps = [
        first.index(word)
        for word in ("**Install**", "**`reaper doctor`**", "mode=scan", "**`reaper reap --dry-run`**", "**Reap**")
    ]
    assert steps == sorted(steps), "install, doctor, scan for a while, a dry run, then reap"
    for gone in ("## Development", "### Layout", "## Speed\n"):
        assert gone not in text, f"{gone.strip()} belongs beside the README, not in it"


# A path in the repository as the docs write it, in prose or a command (a glob or a brace list
# names several files, not one, and is left out).
REPO_PATH = re.compile(r"(?<![\w/.:-])((?:tests|deploy|charts|bench|reaper|image|requirements)/[\w./-]*\w)(?![*{])")


def test_every_file_the_docs_name_is_there() -> None:
    """Issue 35: the README named tests/prometheus/..., which lives under tests/packaging/.
    (bench/README.md is left out: it records earlier runs, with the files they had then.)"""
    for doc in ("README.md", "DEVELOPMENT.md", "COMPATIBILITY.md", "SECURITY.md"):
        named = set(REPO_PATH.findall((ROOT / doc).read_text()))
        assert named, doc
        missing = sorted(p for p in named if not (ROOT / p).exists())
        assert not missing, f"{doc} names files that are not there: {missing}"
