"""The docs as their readers use them: every link within them, or to a file beside them, goes
somewhere, and the README (the operator's page) names every flag of every command and every
metric the agent exports, as the code has them. How the prose is ordered is left to it."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from reaper.cli import build_parser
from reaper.metrics import ReaperMetrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    "DEVELOPMENT.md",
    "COMPATIBILITY.md",
    "SECURITY.md",
    "bench/README.md",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/*.md")),
)
README = ROOT / "README.md"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def flags_of(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every long option of the parser and of each of its commands, but argparse's own --help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield from flags_of(command)
        elif not isinstance(action, argparse._HelpAction):
            yield from (option for option in action.option_strings if option.startswith("--"))


def metric_names() -> list[str]:
    """Every metric family the agent's registry exports."""
    return [family.name for family in ReaperMetrics(mode="reap").registry.collect()]


def undocumented_flags(text: str, flags: Iterable[str]) -> list[str]:
    """The flags `text` never names whole (`--max-reap` is not named by `--max-reap-ratio`)."""
    return sorted({f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)})


def undocumented_metrics(text: str, names: Iterable[str]) -> list[str]:
    """The metric families `text` never names, alone or as one of their series (`_total`,
    `_bucket`, `_sum`, `_count`)."""
    return sorted({n for n in names if not re.search(rf"\b{re.escape(n)}(_total|_bucket|_sum|_count)?\b", text)})


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


def test_the_first_screen_names_the_two_commands_a_newcomer_runs() -> None:
    text = README.read_text()
    first = "\n".join(text.splitlines()[:60])
    assert "make demo" in first and "make test" in first


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


def test_every_flag_of_every_command_is_in_the_readme() -> None:
    flags = set(flags_of(build_parser()))
    assert {"--version", "--max-reap", "--interval", "--listen"} <= flags, "the parser's flags were not all found"
    assert undocumented_flags(README.read_text(), flags) == []


def test_every_metric_the_agent_exports_is_in_the_readme() -> None:
    names = metric_names()
    assert "cni_reaper_passes" in names and "cni_reaper_pass_duration_seconds" in names
    assert undocumented_metrics(README.read_text(), names) == []


def test_a_flag_or_a_metric_the_readme_leaves_out_is_caught() -> None:
    """The checks above on the README with one flag and one metric taken out wherever named."""
    text = README.read_text()
    flag, metric = "--max-reap", "cni_reaper_passes"
    without = re.sub(rf"{flag}(?![\w-])", "", text)
    without = re.sub(rf"\b{metric}(_total)?\b", "", without)
    assert undocumented_flags(without, flags_of(build_parser())) == [flag]
    assert undocumented_metrics(without, metric_names()) == [metric]
