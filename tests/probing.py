"""Run a tests/probes/<name>.py script under the patched or the unpatched vLLM and read its verdict.

Shared by the pytest fixtures and the benchmarks. The patched vLLM is the running interpreter's
site-packages (the test bed, patched with `apply.py --installed`); the unpatched one is the engine
wheel's `vllm/` unpacked on its own and put first on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "tests" / "probes"
VARIANTS = ("unpatched", "patched")


# What the v0.33.0 series' loader errors for an MTP draft start with (patch 0004): the drafter class
# and the checkpoint; the v0.22.1 series' do not.
_MTP_DRAFT_NAME = re.compile(r"^\w+ \(MTP draft of [^)]*\): ")


class ProbeError(RuntimeError):
    pass


def probe_pythonpath(*first: Path) -> str:
    """PYTHONPATH for a probe process: `first`, then the checkout, where the probes import the `mtpq` and
    `tests` packages from."""
    return os.pathsep.join(map(str, [*first, ROOT]))


def without_mtp_draft_name(error: str) -> str:
    """A draft loading error without its leading "<drafter> (MTP draft of <checkpoint>): "."""
    return _MTP_DRAFT_NAME.sub("", error, count=1)


def run_probe(name: str, variant: str, unpatched_vllm: Path, patched_vllm: Path, *args: str) -> dict:
    """The probe's last stdout line as JSON; fails unless it imported the expected vLLM."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    vllm_dir = unpatched_vllm if variant == "unpatched" else patched_vllm
    env = {
        **os.environ,
        "PYTHONPATH": probe_pythonpath(*([unpatched_vllm] if variant == "unpatched" else [])),
        # vLLM caches model-class checks by each model file's hash, one entry per class: one cache
        # per test bed and variant keeps alternating variants, or the other target's sessions, from
        # re-checking every architecture (~20 s each) at every switch.
        "VLLM_CACHE_ROOT": str(unpatched_vllm.with_name(f"{unpatched_vllm.name}.vllm-cache-{variant}")),
    }
    done = subprocess.run(
        [sys.executable, str(PROBES / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROBES.parent,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ProbeError(f"probe {name} ({variant}) exited {done.returncode}:\n{done.stderr[-4000:]}")
    verdict = json.loads(lines[-1])
    if not verdict.get("vllm_file", "").startswith(str(vllm_dir)):
        raise ProbeError(f"probe {name} imported vllm from {verdict.get('vllm_file')}, not {vllm_dir}")
    return verdict
