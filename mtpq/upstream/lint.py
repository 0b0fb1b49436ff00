"""Lint a series' vLLM-side files the way upstream's pre-commit does for them.

The tree is the release's sdist with the series committed on it (checked out in a scratch worktree).
ruff and typos run at the versions upstream's .pre-commit-config.yaml pins (installed from
upstream-lint.lock, sha256-verified), with upstream's own configuration; upstream's Python hooks run
from the tree itself on the files they select. mypy is not run: upstream runs it over whole packages
with a pinned toolchain. Beside them, `review` reports what a vLLM reviewer refuses in the lines the
series adds (REVIEW_RULES).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtpq.core import gittree
from mtpq.core.download import cache_root, pip_environment, scratch_dir
from mtpq.core.errors import MtpqError
from mtpq.core.package_data import package_path
from mtpq.core.pin import Pin
from mtpq.core.series import Series, file_diffs

LOCK = package_path("mtpq.upstream", "upstream-lint.lock")
_READY = ".mtpq-ready"


class LintError(MtpqError, ValueError):
    """The linters cannot run: upstream pins no such tool, or the series does not apply."""


def _python(path: str) -> bool:
    return path.endswith(".py")


# Upstream's hooks for Python files: (hook id, script under tools/pre_commit/, which files).
HOOKS: tuple[tuple[str, str, Callable[[str], bool]], ...] = (
    ("check-spdx-header", "check_spdx_header.py", _python),
    ("check-forbidden-imports", "check_forbidden_imports.py", _python),
    ("check-torch-cuda-call", "check_torch_cuda.py", _python),
    ("check-boolean-context-manager", "check_boolean_context_manager.py", _python),
    ("validate-config", "validate_config.py", _python),
    (
        "check-trust-remote-code",
        "check_trust_remote_code.py",
        lambda path: path.startswith("vllm/") and _python(path),
    ),
    (
        "check-test-tethering",
        "check_test_tethering.py",
        lambda path: path.startswith("tests/") and _python(path),
    ),
)


@dataclass(frozen=True)
class HookResult:
    hook: str
    ok: bool
    output: str


def _pinned_rev(tree: Path, tool: str) -> str:
    """The version upstream's pre-commit pins for ruff or typos (`rev: v0.14.0`)."""
    config = (tree / ".pre-commit-config.yaml").read_text()
    found = re.search(rf"repo: https://github.com/[\w-]+/{re.escape(tool)}\S*\s+rev: v?([\w.]+)", config)
    if not found:
        raise LintError(f"{tree}/.pre-commit-config.yaml pins no {tool}")
    return found.group(1)


def _locked_versions() -> dict[str, str]:
    versions = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("==")
            versions[name] = rest.split()[0]
    return versions


def lint_tools() -> Path:
    """A directory with ruff and typos at the locked versions, installed once (hashes verified)."""
    key = _locked_versions()
    target = (
        cache_root() / "upstream-lint" / "-".join(f"{name}{version}" for name, version in sorted(key.items()))
    )
    if (target / _READY).exists():
        return target
    shutil.rmtree(target, ignore_errors=True)  # a killed install's half
    install = ["install", "-qq", "--require-hashes", "--no-deps", "--target", str(target), "-r", str(LOCK)]
    subprocess.run([sys.executable, "-m", "pip", *install], check=True, env=pip_environment())
    (target / _READY).touch()
    return target


# What a vLLM reviewer refuses in code a series adds under vllm/, beyond upstream's hooks.
REVIEW_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("reads a frame's local variables", re.compile(r"\bf_locals\b")),
    ("catches every exception", re.compile(r"^\s*except\s*(?::|\(?\s*(?:Exception|BaseException)\b)")),
    ("imports a private vLLM name", re.compile(r"^\s*from vllm[\w.]* import .*\b_\w")),
)
_VLLM_IMPORT_OPENS = re.compile(r"^\s*from vllm[\w.]* import \($")
_PRIVATE_IMPORTED = re.compile(r"^\s*_\w+(?: as \w+)?,?$")


def review(series: Series) -> HookResult:
    """REVIEW_RULES over the lines the series' patches add to files under vllm/ (tests excepted),
    each finding named by patch, file and line."""
    findings = [
        f"{patch.name}: {path}: {rule}: {line.strip()}"
        for patch in series.patches
        for path, diff in file_diffs(patch.data.decode())
        if path.startswith("vllm/") and "/tests/" not in path
        for line, in_vllm_import in _added_lines(diff)
        for rule, pattern in REVIEW_RULES
        if pattern.search(line)
        or (rule == "imports a private vLLM name" and in_vllm_import and _PRIVATE_IMPORTED.match(line))
    ]
    return HookResult("mtpq-review", not findings, "\n".join(findings))


def _added_lines(diff: str):
    """(added line, whether it lies inside a parenthesized `from vllm... import (`) of a file's diff."""
    in_vllm_import = False
    for line in diff.splitlines():
        if line[:1] not in (" ", "+") or line.startswith("+++ "):
            continue
        code = line[1:]
        if line[0] == "+":
            yield code, in_vllm_import
        if _VLLM_IMPORT_OPENS.match(code):
            in_vllm_import = True
        elif in_vllm_import and code.strip().startswith(")"):
            in_vllm_import = False


def lint(pin: Pin, series: Series, python: str) -> list[HookResult]:
    """Run upstream's linters on every file the series touches, in the release's tree with the series
    on it. `python` runs upstream's hook scripts (it needs regex and PyYAML)."""
    tools = lint_tools()
    repo = gittree.open_repo(gittree.pinned_tree(pin))
    results, commit = gittree.series_commit(repo, series, pin.tag)
    if not all(result.ok for result in results):
        raise LintError(f"the series does not apply to vLLM {pin.version}; lint needs it applied")
    files = list(series.files)
    with scratch_dir("upstream-lint") as scratch:
        tree = scratch / "vllm"
        repo.git("worktree", "prune")  # a killed run's worktree, its directory swept with its scratch
        repo.git("worktree", "add", "--detach", str(tree), commit)
        try:
            return [*_run_hooks(tree, tools, files, python), review(series)]
        finally:
            repo.git("worktree", "remove", "--force", str(tree))


def _run_hooks(tree: Path, tools: Path, files: list[str], python: str) -> list[HookResult]:
    locked = _locked_versions()
    pinned = {tool: _pinned_rev(tree, tool) for tool in ("ruff", "typos")}
    results = [
        HookResult(
            f"{tool} version", locked[tool] == rev, f"upstream pins {rev}, upstream-lint.lock {locked[tool]}"
        )
        for tool, rev in pinned.items()
    ]
    python_files = [path for path in files if _python(path)]
    commands = {
        "ruff-check": [str(tools / "bin" / "ruff"), "check", "--no-fix", *python_files],
        "ruff-format": [str(tools / "bin" / "ruff"), "format", "--check", "--diff", *python_files],
        "typos": [str(tools / "bin" / "typos"), "--force-exclude", *files],
    }
    for hook, script, selects in HOOKS:
        selected = [path for path in files if selects(path)]
        if selected:
            commands[hook] = [python, f"tools/pre_commit/{script}", *selected]
    for hook, command in commands.items():
        done = subprocess.run(command, cwd=tree, capture_output=True, text=True)
        results.append(HookResult(hook, done.returncode == 0, (done.stdout + done.stderr).strip()))
    return results
