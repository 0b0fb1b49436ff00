"""Per-patch results and the status table every mode prints."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

APPLIED = "applied"
APPLIED_3WAY = "applied (3-way)"
ALREADY_UPSTREAM = "already upstream"
ALREADY_APPLIED = "already applied"
CONFLICT = "conflict"
FAILED = "failed"
NOT_TRIED = "not tried"
SUCCESSES = (APPLIED, APPLIED_3WAY, ALREADY_UPSTREAM, ALREADY_APPLIED)
# Shorter words for the rebase matrix (mtpq/apply/matrix.py), whose column per release must stay narrow.
MATRIX_WORDS = {APPLIED: "clean", APPLIED_3WAY: "3-way"}
# What --check says of a patch it only tried: nothing was applied.
DRY_RUN_WORDS = {APPLIED: "would apply", APPLIED_3WAY: "would apply (3-way)"}


@dataclass
class PatchResult:
    name: str
    status: str
    files: list[str] = field(default_factory=list)
    reason: str = ""
    failed_hunks: int = 0  # of a conflict: the patch's hunks that do not apply

    @property
    def ok(self) -> bool:
        return self.status in SUCCESSES

    def describe(self, dry_run: bool = False) -> str:
        if self.status == CONFLICT:
            return f"{CONFLICT}: {', '.join(self.files)}"
        if self.status == FAILED:
            return f"{FAILED}: {self.reason}"
        return DRY_RUN_WORDS.get(self.status, self.status) if dry_run else self.status

    def matrix_word(self) -> str:
        if self.status == CONFLICT:
            return f"{CONFLICT} ({self.failed_hunks} hunks)"
        return MATRIX_WORDS.get(self.status, self.status)


def all_ok(results: list[PatchResult]) -> bool:
    return all(result.ok for result in results)


def format_table(title: str, results: list[PatchResult], dry_run: bool = False) -> str:
    """dry_run: the results of --check, which applied nothing."""
    width = max((len(r.name) for r in results), default=0)
    lines = [title]
    lines += [f"  {r.name:<{width}}  {r.describe(dry_run)}" for r in results]
    words = DRY_RUN_WORDS if dry_run else {}
    counts = Counter(words.get(r.status, r.status) for r in results)
    summary = ", ".join(f"{count} {status}" for status, count in counts.items())
    checked = " (--check: nothing was changed)" if dry_run else ""
    lines.append(f"{summary or 'nothing to do'}; {len(results)} patch(es) total{checked}")
    return "\n".join(lines)
