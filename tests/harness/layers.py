"""The layering rules of `reaper/`, checked over its import graph (read with `ast`, never imported).

A rule names the modules it binds (a module and everything beneath it) and the modules they may
not import. Every import statement counts, at module level or inside a function (a lazy import
still ties the layers), except those under `if TYPE_CHECKING:` (types only, never run). A
relative import is resolved against the importing module's package; `from a import b` imports
`a.b` when that is a module, and `a` otherwise. Imports by string (`importlib`) are not seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Rule:
    """The modules `bound` (each with everything beneath it) import nothing of `forbidden`."""

    name: str
    bound: tuple[str, ...]
    forbidden: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Allowed:
    """A known break of a rule, kept until the issue named moves the code to its right home."""

    importer: str
    imported: str
    issue: str


@dataclass(frozen=True, kw_only=True)
class Import:
    """One name an import statement takes: the module it resolves to, and the name as written."""

    importer: str
    imported: str
    name: str
    line: int


@dataclass(frozen=True, kw_only=True)
class Violation:
    rule: str
    found: Import

    def line(self, root: Path) -> str:
        """One line: where, what, and which rule it breaks."""
        path = module_path(root, self.found.importer)
        shown = path.relative_to(root.parent) if path is not None else self.found.importer
        return (
            f"{shown}:{self.found.line}: {self.found.importer} imports {self.found.name} "
            f"(from {self.found.imported}; rule: {self.rule})"
        )


def within(module: str, prefix: str) -> bool:
    """Whether `module` is `prefix` or beneath it (`a.b` is within `a`, `ab` is not)."""
    return module == prefix or module.startswith(prefix + ".")


def module_name(root: Path, path: Path) -> str:
    """`reaper/host/files.py` -> `reaper.host.files`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_path(root: Path, module: str) -> Path | None:
    """The file of `module` beneath `root`'s parent, or None when it is not one of ours."""
    base = root.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement beneath `body`, skipping the body of `if TYPE_CHECKING:` (not its else)."""
    for node in body:
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements(node.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if not isinstance(children, list):
                continue
            for child in children:
                if isinstance(child, ast.stmt):
                    yield from _statements([child])
                elif isinstance(child, ast.ExceptHandler | ast.match_case):
                    yield from _statements(child.body)


def _package_of(root: Path, path: Path) -> str:
    name = module_name(root, path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(root: Path, path: Path) -> Iterator[Import]:
    """The imports `path` makes at run time, with their targets resolved to module names."""
    importer = module_name(root, path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer=importer, imported=alias.name, name=alias.name, line=node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(root, path).split(".")
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                is_module = module_path(root, submodule) is not None
                target = submodule if is_module else base
                yield Import(importer=importer, imported=target, name=alias.name, line=node.lineno)


def violations(root: Path, rules: tuple[Rule, ...], allowed: tuple[Allowed, ...] = ()) -> list[Violation]:
    """Every import under `root` (a package directory) that breaks a rule and is not allowed."""
    excused = {(entry.importer, entry.imported) for entry in allowed}
    found: list[Violation] = []
    for path in sorted(root.rglob("*.py")):
        for imported in imports_of(root, path):
            if (imported.importer, imported.imported) in excused:
                continue
            for rule in rules:
                bound = any(within(imported.importer, prefix) for prefix in rule.bound)
                if bound and any(within(imported.imported, prefix) for prefix in rule.forbidden):
                    found.append(Violation(rule=rule.name, found=imported))
    return found
