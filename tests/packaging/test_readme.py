"""The docs as their readers use them: every link within them, or to a file beside them, goes
somewhere (an `#anchor` to a heading that is there, as GitHub names it); every flag of every
command is named in the README or docs/, and docs/reference.md says what splits each repeatable
variable; the README (the operator's page) names every metric the agent exports, stays short,
and opens with the two commands a newcomer runs. How the prose is ordered is left to it.

Each check is a function of a doc's text, so that the tests at the end can show it failing on a
small bad doc."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from reaper.cli import build_parser
from reaper.metrics import ReaperMetrics
from reaper.settings import OPTIONS

ROOT = Path(__file__).resolve().parents[2]
# Every page written for a reader, whose links must go somewhere.
DOCS = (
    "README.md",
    "DEVELOPMENT.md",
    "COMPATIBILITY.md",
    "SECURITY.md",
    "CHANGELOG.md",
    "bench/README.md",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/*.md")),
)
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"  # its option table: a row a flag, with its variable
# The operator's page: one that grows past this has taken in what belongs in docs/.
README_MAX_LINES = 350
# "Opens with": both commands are on the first screen, before the page's second section.
OPENING_LINES = 30

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6} +(.*?)\s*#*\s*$")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose_lines(text: str) -> Iterator[str]:
    """The lines of `text` outside fenced code blocks (a `# comment` in a shell block is no
    heading, and a `](x)` there no link)."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation but `-` and `_` dropped, lower
    case, each space a `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor GitHub gives the headings of `text`: a heading's slug, and for the second
    and later headings of one slug, `-1`, `-2`, ... after it."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def broken_links(doc: Path) -> list[str]:
    """The relative links of `doc` whose file is not there, or whose `#anchor` no heading of
    that file (or of `doc`, for `#anchor` alone) gives. Links to the web are not followed."""
    broken = []
    for line in prose_lines(doc.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            linked = (doc.parent / file).resolve() if file else doc
            missing = not linked.exists()
            if missing or (anchor and (linked.is_dir() or anchor not in anchors(linked.read_text()))):
                broken.append(target)
    return broken


def flags_of(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every long option of the parser and of each of its commands, but argparse's own --help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield from flags_of(command)
        elif not isinstance(action, argparse._HelpAction):
            yield from (option for option in action.option_strings if option.startswith("--"))


def metric_names() -> list[str]:
    """Every metric family reaper/metrics.py defines, as the agent's registry exports it."""
    return [family.name for family in ReaperMetrics(mode="reap").registry.collect()]


def undocumented_flags(text: str, flags: Iterable[str]) -> list[str]:
    """The flags `text` never names whole (`--max-reap` is not named by `--max-reap-ratio`)."""
    return sorted({f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)})


def undocumented_metrics(text: str, names: Iterable[str]) -> list[str]:
    """The metric families `text` never names, alone or as one of their series (`_total`,
    `_bucket`, `_sum`, `_count`)."""
    return sorted({n for n in names if not re.search(rf"\b{re.escape(n)}(_total|_bucket|_sum|_count)?\b", text)})


def unstated_separators(text: str, separators: Iterable[tuple[str, str]]) -> list[str]:
    """The variables (with the separator their value splits on) whose row in the option table of
    `text` does not say that separator, as `(`:`-separated)`."""
    rows = {m[1]: m[0] for m in re.finditer(r"^\|[^|]*\| `(REAPER_\w+)`.*$", text, re.M)}
    return sorted(env for env, sep in separators if f"`{sep}`-separated" not in rows.get(env, ""))


def readme_problems(text: str) -> list[str]:
    """What keeps `text` from being the operator's page: too long, or not opening with the two
    commands a newcomer on a fresh machine runs."""
    problems = []
    lines = text.splitlines()
    if len(lines) > README_MAX_LINES:
        problems.append(f"{len(lines)} lines, over {README_MAX_LINES}: move the why to docs/")
    opening = []
    sections = 0
    for line in lines[:OPENING_LINES]:
        sections += line.startswith("## ")
        if sections == 2:
            break
        opening.append(line)
    first = "\n".join(opening)
    for command in ("make demo", "make test"):
        if command not in first:
            problems.append(f"`{command}` is not in its opening")
    return problems


def flag_and_doc_texts() -> str:
    """Where a flag may be documented: the README and every page under docs/."""
    return "\n".join(p.read_text() for p in (README, *sorted(ROOT.glob("docs/*.md"))))


def test_every_link_within_the_docs_goes_somewhere() -> None:
    assert (ROOT / "docs" / "design.md").exists(), "docs/design.md, the contributors' why"
    for doc in DOCS:
        assert broken_links(ROOT / doc) == [], doc


def test_the_readme_is_the_operators_page() -> None:
    assert readme_problems(README.read_text()) == []


# A path in the repository as the docs write it, in prose or a command (a glob or a brace list
# names several files, not one, and is left out).
REPO_PATH = re.compile(r"(?<![\w/.:-])((?:tests|deploy|charts|bench|reaper|image|requirements)/[\w./-]*\w)(?![*{])")


def test_every_file_the_docs_name_is_there() -> None:
    """Issue 35: the README named tests/prometheus/..., which lives under tests/packaging/.
    (bench/README.md and CHANGELOG.md are left out: they record earlier states, with the files
    they had then.)"""
    for doc in ("README.md", "DEVELOPMENT.md", "COMPATIBILITY.md", "SECURITY.md", "docs/design.md"):
        named = set(REPO_PATH.findall((ROOT / doc).read_text()))
        assert named, doc
        missing = sorted(p for p in named if not (ROOT / p).exists())
        assert not missing, f"{doc} names files that are not there: {missing}"


def test_every_flag_of_every_command_is_in_the_readme_or_docs() -> None:
    flags = set(flags_of(build_parser()))
    assert {"--version", "--max-reap", "--interval", "--listen", "--drop-waiting"} <= flags, "flags not all found"
    assert undocumented_flags(flag_and_doc_texts(), flags) == []


def repeatable_variables() -> list[tuple[str, str]]:
    return [(o.env, o.separator) for o in OPTIONS if o.env and o.separator]


def test_every_repeatable_variable_says_what_splits_it() -> None:
    """An operator setting REAPER_IPAM_DIR to two dirs must know to join them with `:`."""
    assert ("REAPER_IPAM_DIR", ":") in repeatable_variables()
    assert unstated_separators(REFERENCE.read_text(), repeatable_variables()) == []


def test_every_metric_the_agent_exports_is_in_the_readme() -> None:
    names = metric_names()
    assert "cni_reaper_passes" in names and "cni_reaper_pass_duration_seconds" in names
    assert undocumented_metrics(README.read_text(), names) == []


# The checks above, each shown failing on a doc that breaks it.


def test_a_flag_or_a_metric_the_readme_leaves_out_is_caught() -> None:
    """The checks above on the README with one flag and one metric taken out wherever named."""
    text = README.read_text()
    flag, metric = "--max-reap", "cni_reaper_passes"
    without = re.sub(rf"{flag}(?![\w-])", "", text)
    without = re.sub(rf"\b{metric}(_total)?\b", "", without)
    assert undocumented_flags(without, flags_of(build_parser())) == [flag]
    assert undocumented_metrics(without, metric_names()) == [metric]


def test_a_variable_whose_separator_is_not_said_is_caught() -> None:
    text = REFERENCE.read_text().replace("`REAPER_EXCLUDE_POD` (`,`-separated)", "`REAPER_EXCLUDE_POD`")
    assert unstated_separators(text, repeatable_variables()) == ["REAPER_EXCLUDE_POD"]


def test_a_link_to_a_missing_file_or_heading_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Leaks persist\n\n## Leaks persist\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n## `reaper explain`: why?\n\n"
        "[ok](other.md#leaks-persist) [ok](other.md#leaks-persist-1) [ok](#reaper-explain-why)\n"
        "[web](https://example.com/x.md#nowhere) [ok](other.md)\n"
        "```sh\n# not a heading\necho '[x](gone.md)'\n```\n"
        "[gone](gone.md) [no heading](other.md#leaks) [third](other.md#leaks-persist-2)\n"
        "[not here](#not-a-heading) [a comment](#not-a-heading)\n"
    )
    assert broken_links(doc) == [
        "gone.md",
        "other.md#leaks",
        "other.md#leaks-persist-2",
        "#not-a-heading",
        "#not-a-heading",
    ]


def test_a_long_readme_or_one_that_does_not_open_with_the_commands_is_caught() -> None:
    good = "# cni-reaper\n\nWhat it is.\n\n## Try it\n\n    make demo\n    make test\n\n## More\n"
    assert readme_problems(good) == []
    assert readme_problems(good + "line\n" * README_MAX_LINES) == [
        f"{len(good.splitlines()) + README_MAX_LINES} lines, over {README_MAX_LINES}: move the why to docs/"
    ]
    late = "# cni-reaper\n\n## Try it\n\n    make demo\n\n## Later\n\n    make test\n"
    assert readme_problems(late) == ["`make test` is not in its opening"]
    buried = "# cni-reaper\n" + "prose\n" * OPENING_LINES + "    make demo\n    make test\n"
    assert readme_problems(buried) == ["`make demo` is not in its opening", "`make test` is not in its opening"]
