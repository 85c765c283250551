"""Shell blocks of the README, by name, so tests run the commands exactly as an operator reads them.

A block is a fenced ```sh block right after a line `<!-- block: NAME -->` (an HTML comment:
GitHub shows nothing of it). The block's text is returned as written, comments and all, for
`sh -eu` to run.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_BLOCK = re.compile(r"^<!-- block: (?P<name>[\w-]+) -->\n```sh\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


class ReadmeError(Exception):
    pass


def blocks(text: str) -> dict[str, str]:
    """Every named block of `text`; a name used twice is an error (a test would run only one)."""
    found: dict[str, str] = {}
    for match in _BLOCK.finditer(text):
        name = match["name"]
        if name in found:
            raise ReadmeError(f"README block {name!r} appears twice")
        found[name] = match["body"]
    return found


def shell_block(name: str) -> str:
    """The README's block `name`, as written."""
    try:
        return blocks(README.read_text())[name]
    except KeyError:
        raise ReadmeError(f"README.md has no block {name!r} (a line `<!-- block: {name} -->` then ```sh)") from None
