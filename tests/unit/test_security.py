"""Static checks of the promises SECURITY.md makes about the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from reaper.cni.invoke import PluginFailure, find_plugin
from reaper.settings import OPTIONS

PACKAGE = Path(__file__).resolve().parents[2] / "reaper"


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def test_no_shell_anywhere() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        tree = ast.parse(path.read_text())
        for call in _calls(tree):
            name = ast.unparse(call.func)
            if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"):
                offenders.append(f"{path.name}:{call.lineno} {name}")
            for kw in call.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    offenders.append(f"{path.name}:{call.lineno} shell=")
            for arg in call.args:
                if isinstance(arg, ast.List) and arg.elts:
                    first = arg.elts[0]
                    if isinstance(first, ast.Constant) and first.value in ("sh", "bash", "/bin/sh", "/bin/bash"):
                        offenders.append(f"{path.name}:{call.lineno} {first.value}")
    assert offenders == []


def test_the_agent_listens_on_loopback_by_default() -> None:
    listen = next(o for o in OPTIONS if o.flag == "--listen")
    assert listen.default is not None and listen.default.startswith("127.0.0.1:")


def test_plugins_run_only_from_the_bin_dirs(tmp_path: Path) -> None:
    (tmp_path / "bridge").write_text("#!/bin/true\n")
    (tmp_path / "bridge").chmod(0o755)
    assert find_plugin("bridge", (str(tmp_path),)) == str(tmp_path / "bridge")
    for bad in ("../bridge", "/usr/bin/id", "bri dge", "", "a/b"):
        with pytest.raises(PluginFailure):
            find_plugin(bad, (str(tmp_path),))
    with pytest.raises(PluginFailure, match="not found"):
        find_plugin("portmap", (str(tmp_path),))


def test_every_test_security_md_names_exists() -> None:
    """SECURITY.md backs each claim with a test: each one it names is defined where it says."""
    root = Path(__file__).resolve().parents[2]
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)", (root / "SECURITY.md").read_text())
    assert len(named) > 20
    missing = [f"{path}::{name}" for path, name in named if f"def {name}(" not in (root / path).read_text()]
    assert not missing
