"""A series as upstream pull requests: the readiness check, and one directory per patch with the
patch and the body file `gh pr create --body-file` takes.

A patch's message is its PR description: a `[Area] ...` title, then the sections `Purpose:`,
`Test Plan:` and `Test Result:` (each a line of its own, followed by its text), then the DEP-3
fields. `Bug:` is the issue the patch fixes (the pull requests it relates to go in the text); where
no bug report exists it is left out and the Purpose says so. A patch whose `Forwarded:` is
`not-needed` (a backport that makes an older release match a newer one) is not proposed and not
checked.

The proposed patches are numbered as they apply and must be merged: the k-th is `NNNN-<name>.patch`
with NNNN = k (0001, 0002, ...; no letter suffixes); a patch not proposed carries no number.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from mtpq.core import crashsafe
from mtpq.core.errors import MtpqError
from mtpq.core.series import DEP3_FIELDS, Patch, Series

SECTIONS = ("Purpose", "Test Plan", "Test Result")
NOT_FOR_UPSTREAM = "not-needed"
_TITLE = re.compile(r"(\[[^\]\s][^\]]*\])+ \S.*")
_THREAD_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+")
_BUG_REPORT_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/issues/\d+")
_TEST_FILE = re.compile(r"tests/(.+/)?test_[^/]+\.py")
# Our own notes and issue tracker mean nothing upstream: a PR cites upstream threads by URL.
_LOCAL_REFERENCE = re.compile(r"\bseeds/|\bnotes/|\bmtpq (issue|task)\b", re.IGNORECASE)
_NUMBERED = re.compile(r"(\d{4})-[a-z0-9][a-z0-9._-]*\.patch")
_SECTION_LINE = re.compile(rf"^({'|'.join(SECTIONS)}):\s*$", re.MULTILINE)


class NotReadyError(MtpqError, ValueError):
    """The series fails the readiness check; the message lists every finding."""


@dataclass(frozen=True)
class Finding:
    patch: str
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.patch}: {self.field}: {self.problem}"


def proposed(series: Series) -> list[Patch]:
    """The patches meant to go upstream, in series order."""
    return [patch for patch in series.patches if patch.dep3["Forwarded"] != NOT_FOR_UPSTREAM]


def test_files(patch: Patch) -> list[str]:
    """The test files (in the vLLM tree's tests/) the patch adds or changes."""
    return [path for path in patch.files if _TEST_FILE.fullmatch(path)]


def sections(patch: Patch) -> dict[str, str]:
    """The message's PR sections by name; the DEP-3 fields end the last one."""
    parts = _SECTION_LINE.split(patch.message)
    found = dict(zip(parts[1::2], parts[2::2], strict=True))
    return {name: _without_dep3(text).strip() for name, text in found.items()}


def _without_dep3(text: str) -> str:
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.partition(":")[0] in DEP3_FIELDS:
            return "\n".join(lines[:index])
    return text


def check_ready(series: Series) -> list[Finding]:
    """Every reason a proposed patch is not ready to be a pull request (empty: ready)."""
    findings = _numbering(series)
    for patch in proposed(series):
        found = sections(patch)

        def problem(field: str, text: str, patch: Patch = patch) -> None:
            findings.append(Finding(patch.name, field, text))

        if not _TITLE.fullmatch(patch.subject):
            problem("title", f"not in vLLM's '[Area] Summary' form: {patch.subject!r}")
        bug = patch.dep3.get("Bug")
        if bug is None and "bug report" not in found.get("Purpose", ""):
            problem("Bug", "missing, and the Purpose does not say that no upstream bug report exists")
        elif bug is not None and not _BUG_REPORT_URL.fullmatch(bug):
            problem("Bug", f"must be the URL of the upstream bug report (an issue) it fixes, not {bug!r}")
        forwarded = patch.dep3["Forwarded"]
        if forwarded != "no" and not _THREAD_URL.fullmatch(forwarded):
            problem(
                "Forwarded",
                f"must be 'no', '{NOT_FOR_UPSTREAM}' or the pull request's URL, not {forwarded!r}",
            )
        for name in SECTIONS:
            if not found.get(name):
                problem(name, "missing or empty section")
        tests = test_files(patch)
        if not tests:
            problem("tests", "adds no test file under tests/ (tests/**/test_*.py)")
        plan = found.get("Test Plan", "")
        for path in tests:
            if plan and path not in plan:
                problem("Test Plan", f"does not name its test file {path}")
        if found.get("Test Result") and not re.search(r"\d", found["Test Result"]):
            problem("Test Result", "gives no figures")
        if match := _LOCAL_REFERENCE.search(patch.message):
            problem("message", f"cites a local reference ({match.group(0)!r}); cite upstream threads by URL")
    return findings


def _numbering(series: Series) -> list[Finding]:
    """The proposed patches numbered 0001, 0002, ... in series order; the others unnumbered."""
    findings = []
    stack = proposed(series)
    for patch in series.patches:
        match = _NUMBERED.fullmatch(patch.name)
        if patch not in stack:
            if match:
                findings.append(Finding(patch.name, "name", "is not proposed upstream, so it has no number"))
            continue
        expected = f"{stack.index(patch) + 1:04d}"
        if not match or match.group(1) != expected:
            place = f"pull request {int(expected)} of the stack: name it {expected}-<name>.patch"
            findings.append(Finding(patch.name, "name", place))
    return findings


def pr_body(patch: Patch, stack: list[Patch]) -> str:
    """The pull request's description, in vLLM's template sections."""
    found = sections(patch)
    text = "".join(f"## {name}\n\n{found[name]}\n\n" for name in SECTIONS)
    position = stack.index(patch)
    if position:
        earlier = "".join(f"- {earlier.subject}\n" for earlier in stack[:position])
        text += f"## Depends on\n\nThis change builds on, and must be merged after:\n\n{earlier}\n"
    return text


def write_pull_requests(series: Series, out: Path) -> list[Path]:
    """One directory per proposed patch under `out`: the patch as `git format-patch` gives it,
    `title.txt` and `body.md`. Refuses (writing nothing) if the series is not ready or `out` exists;
    `out` appears complete or not at all."""
    if findings := check_ready(series):
        raise NotReadyError("the series is not ready for upstream:\n" + "\n".join(f"  {f}" for f in findings))
    if out.exists():
        raise NotReadyError(f"{out} exists; give a new directory")
    stack = proposed(series)
    with crashsafe.private_path(out.parent, f".{out.name}.", is_dir=True) as staging:
        for patch in stack:
            directory = staging / patch.path.stem
            directory.mkdir()
            shutil.copyfile(patch.path, directory / patch.name)
            (directory / "title.txt").write_text(patch.subject + "\n")
            (directory / "body.md").write_text(pr_body(patch, stack))
        staging.rename(out)
    return sorted(path for path in out.iterdir())
