"""The `mtpq` command run as a user runs it, in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_mtpq(*args: str) -> subprocess.CompletedProcess:
    """`python -m mtpq ARGS` as a user runs it: with the standard library alone (-S: no site-packages,
    so no torch, vLLM or regex)."""
    return subprocess.run(
        [sys.executable, "-S", "-m", "mtpq", *map(str, args)], cwd=ROOT, capture_output=True, text=True
    )
