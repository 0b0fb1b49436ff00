"""Edits a test makes to a copy of a patch file: a hunk appended that adds or changes a vLLM file."""

from __future__ import annotations

import difflib
from pathlib import Path


def add_new_file(patch_path: Path, path: str, *lines: str) -> None:
    """Append to a patch file the creation of `path` holding `lines`."""
    added = "".join(f"+{line}\n" for line in lines)
    with patch_path.open("a") as patch:
        patch.write(
            f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..1111111\n"
            f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{added}"
        )


def change_file(patch_path: Path, path: str, before: str, after: str) -> None:
    """Append to a patch file the change of `path` from the text `before` to `after`."""
    diff = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    with patch_path.open("a") as patch:
        patch.write(f"diff --git a/{path} b/{path}\n" + "".join(diff))
