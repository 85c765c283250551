"""What importing the reaper costs a one-shot: msgspec without typing_extensions (20 ms of every
start), and nothing taken from whatever imports typing_extensions after it (grpc)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import reaper.cli, reaper.scan
from typing import Literal
import msgspec
before = "typing_extensions" in sys.modules

class Shape(msgspec.Struct, frozen=True):
    kind: Literal["a", "b"]
    names: tuple[str, ...] = ()

read = msgspec.json.decode(b'{"kind": "b", "names": ["x"]}', type=Shape)
try:
    msgspec.json.decode(b'{"kind": "c"}', type=Shape)
    refused = False
except msgspec.ValidationError:
    refused = True
import grpc, typing_extensions
print(json.dumps({"before": before, "read": [read.kind, list(read.names)], "refused": refused,
                  "after": "typing_extensions" in sys.modules and typing_extensions.Literal is not None}))
"""


def test_msgspec_is_imported_without_typing_extensions_and_reads_types_alike() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(proc.stdout) == {"before": False, "read": ["b", ["x"]], "refused": True, "after": True}


def test_a_process_that_imported_typing_extensions_first_is_left_as_it_is() -> None:
    probe = "import sys, typing_extensions, reaper, msgspec._utils as u; print(u._get_type_hints.__module__)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert proc.stdout.strip() == "typing_extensions"
