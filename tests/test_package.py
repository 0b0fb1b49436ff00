"""The mtpq package's structure: every module imports on its own, no two modules import each other
(directly or round a longer circle, at the top or inside a function), the three concerns import what
they share (mtpq.core) and never one another, every error derives from the one base the command lines
catch, and no two classes share a name."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from mtpq.core.errors import MtpqError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mtpq"
ENTRY_POINT = "mtpq.__main__"  # runs the command line when imported


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> set[str]:
    """The mtpq modules a module imports when it runs: every import statement, also inside functions,
    except those under `if TYPE_CHECKING:`, which only type checkers run."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for statement in block.body
        for node in ast.walk(statement)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from mtpq.core import gittree` imports the module mtpq.core.gittree.
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(MODULES)
            found |= submodules or {node.module}
    return {name for name in found if name in MODULES}


def import_graph() -> dict[str, set[str]]:
    return {name: imported_modules(path) for name, path in MODULES.items()}


def circle_from(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules, the first repeated at the end), or None."""
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> list[str] | None:
        if name in trail:
            return trail[trail.index(name) :] + [name]
        if name in done:
            return None
        for target in sorted(graph[name]):
            if circle := visit(target, [*trail, name]):
                return circle
        done.add(name)
        return None

    return next(filter(None, (visit(name, []) for name in sorted(graph))), None)


def test_no_module_imports_itself_round_a_circle():
    assert circle_from(import_graph()) is None, " -> ".join(circle_from(import_graph()))


@pytest.mark.parametrize("concern", ["apply", "checkpoint", "upstream"])
def test_a_concern_imports_the_core_and_never_another_concern(concern):
    others = tuple(f"mtpq.{other}." for other in ("apply", "checkpoint", "upstream") if other != concern)
    imported = {
        target
        for name, targets in import_graph().items()
        if name.startswith(f"mtpq.{concern}.")
        for target in targets
    }
    assert {target for target in imported if target.startswith(others)} == set()
    assert any(target.startswith("mtpq.core.") for target in imported)


def test_the_circle_finder_finds_one():
    assert circle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle_from({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", sorted(set(MODULES) - {ENTRY_POINT}))
def test_module_imports_on_its_own(name):
    """A fresh interpreter imports it first, as a tool or test that needs only it does."""
    done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def classes() -> list[type]:
    return [
        value
        for name in sorted(set(MODULES) - {ENTRY_POINT})
        for value in vars(importlib.import_module(name)).values()
        if inspect.isclass(value) and value.__module__ == name
    ]


# pytest plugins loaded by name in vLLM's own test runs, where mtpq is not importable: their errors are
# test failures there, never an mtpq command's.
PLUGINS = "mtpq.upstream.native_plugin."


def test_every_error_derives_from_mtpq_error():
    errors = [
        cls for cls in classes() if issubclass(cls, Exception) and not cls.__module__.startswith(PLUGINS)
    ]
    assert errors and [cls for cls in errors if not issubclass(cls, MtpqError)] == []


def test_no_two_classes_share_a_name():
    defined: dict[str, list[str]] = {}
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {name: where for name, where in defined.items() if len(where) > 1} == {}
