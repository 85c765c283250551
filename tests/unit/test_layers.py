"""The layers of `reaper/` over its import graph (DEVELOPMENT.md, "Layers"): `host/` knows the
kernel and files and nothing of CNI, `kinds/` never reaches into `reap/`, the pure core imports
no module that does I/O, and netlink has one writer (no pyroute2). Read with `ast`
(tests/harness/layers.py), never imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.layers import Allowed, Rule, imports_of, violations

REAPER = Path(__file__).resolve().parents[2] / "reaper"

# The modules whose answers are a function of their arguments (DEVELOPMENT.md names them).
PURE_CORE = (
    "reaper.reconcile",
    "reaper.correlate",
    "reaper.reap.plan",
    "reaper.reap.trust",
    "reaper.reap.waiting",
    "reaper.reap.stays",
)
# What does I/O: the standard library's files, processes, sockets and clock, the third-party
# clients, and the reaper's own readers of the node and the runtimes and its acting steps.
IO_MODULES = (
    "os",
    "subprocess",
    "socket",
    "shutil",
    "pathlib",
    "tempfile",
    "fcntl",
    "glob",
    "select",
    "signal",
    "time",
    "psutil",
    "pyroute2",
    "grpc",
    "lightkube",
    "reaper.host",
    "reaper.runtime",
    "reaper.cni.invoke",
    "reaper.reap.act",
    "reaper.reap.run",
)
RULES = (
    Rule(
        name="host knows no CNI",
        bound=("reaper.host",),
        forbidden=(
            "reaper.kinds",
            "reaper.reap",
            "reaper.cni",
            "reaper.runtime",
            "reaper.scan",
            "reaper.reconcile",
            "reaper.correlate",
        ),
    ),
    Rule(name="kinds below reap", bound=("reaper.kinds",), forbidden=("reaper.reap",)),
    Rule(name="pure core", bound=PURE_CORE, forbidden=IO_MODULES),
    # reaper/host/netlink.py reads and writes netlink on its own socket (why: DEVELOPMENT.md,
    # "Netlink: one reader, one writer").
    Rule(name="one netlink writer", bound=("reaper",), forbidden=("pyroute2",)),
)
# Known breaks, each until the issue named moves the code to its right home (none left: the
# planning act.py held went to reap/requests.py).
ALLOWED: tuple[Allowed, ...] = ()


def test_the_layers_hold() -> None:
    found = violations(REAPER, RULES, ALLOWED)
    assert not found, "imports across the layers:\n" + "\n".join(v.line(REAPER) for v in found)


def test_every_allowance_is_still_needed() -> None:
    """An allowance whose import is gone is dropped, so it never excuses a later one."""
    made = {(i.importer, i.imported) for path in REAPER.rglob("*.py") for i in imports_of(REAPER, path)}
    stale = [a for a in ALLOWED if (a.importer, a.imported) not in made]
    assert not stale, f"allowances no import needs (remove them): {stale}"


def _package(root: Path, files: dict[str, str]) -> Path:
    """A fake `reaper` package under `root` holding `files` (path -> source)."""
    package = root / "reaper"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return package


def test_a_planted_break_is_named_in_one_line(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "host/__init__.py": "",
            "host/links.py": "import os\n\n\ndef later() -> None:\n    from ..kinds import veth\n",
            "kinds/__init__.py": "",
            "kinds/veth.py": "from reaper.reap.act import reclaim\n",
            "reap/__init__.py": "",
            "reap/act.py": "reclaim = 1\n",
            "reap/plan.py": "from reaper.host import links\nimport subprocess as sp\n",
            "reconcile.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import socket\n",
        },
    )
    lines = [v.line(package) for v in violations(package, RULES)]
    assert lines == [
        "reaper/host/links.py:5: reaper.host.links imports veth (from reaper.kinds.veth; rule: host knows no CNI)",
        "reaper/kinds/veth.py:1: reaper.kinds.veth imports reclaim (from reaper.reap.act; rule: kinds below reap)",
        "reaper/reap/plan.py:1: reaper.reap.plan imports links (from reaper.host.links; rule: pure core)",
        "reaper/reap/plan.py:2: reaper.reap.plan imports subprocess (from subprocess; rule: pure core)",
    ]


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("import os.path\n", True),
        ("from os import path\n", True),
        ("try:\n    import fcntl\nexcept ImportError:\n    pass\n", True),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import os\nelse:\n    import time\n", True),
        ("import typing\nif typing.TYPE_CHECKING:\n    import os\n", False),
        ("import osmium\n", False),  # a name that starts like one, not beneath it
    ],
)
def test_what_counts_as_an_import(tmp_path: Path, source: str, caught: bool) -> None:
    package = _package(tmp_path, {"__init__.py": "", "correlate.py": source})
    assert bool(violations(package, RULES)) is caught
