"""The GPU kit (benchmarks/gpu_kit.py): its parts installed by the host's own commands into a venv that
mirrors the host (Python 3.12, its packages), and the GPU run dry-run there (every run's checkpoint
built, its engine configured on a pretend H200, the modules its engine imports imported); a part
missing, damaged or out of order named in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import gpu_kit
from tests.conftest import target_version

# The kit serves vLLM 0.22.1 (the host's torch 2.11.0 is the one it pins): its bed runs the dry run.
needs_kit_target = pytest.mark.skipif(
    target_version() != gpu_kit.VERSION, reason=f"the GPU kit is vLLM {gpu_kit.VERSION}'s"
)


@pytest.mark.engine
@needs_kit_target
def test_the_host_commands_install_the_kit_and_the_run_dry_runs(tmp_path):
    from benchmarks import gpu_run  # torch, through the checkpoint builders

    locked = gpu_kit.LOCK.read_text()
    manifest = gpu_kit.ensure_kit()
    assert gpu_kit.LOCK.read_text() == locked, "the run imports more than the lock holds: commit the new lock"
    assert all(part["bytes"] <= gpu_kit.PART_BYTES for part in manifest["parts"])
    calls = json.loads((gpu_kit.KIT / gpu_kit.HOST_COMMANDS).read_text())
    assert [call["carry"][0] for call in calls] == [f".gpukit/{part['name']}" for part in manifest["parts"]]
    for call in calls:
        carried = sum((gpu_kit.ROOT / path).stat().st_size for path in call["carry"])
        assert carried + 4 * 2**20 <= 64 * 2**20, call  # the working tree travels too (~2 MiB)
        assert len(call["command"]) <= 2000
    # The host's commands verbatim, `python3` the mirror venv's, the kit and site under tmp_path.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"  # a script, not a link: a venv's python knows its venv by its path
    python3.write_text(f'#!/bin/sh\nexec "{gpu_kit.mirror_python()}" "$@"\n')
    python3.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "OUT": str(out),
        "MTPQ_KIT": str(tmp_path / "kit"),
        "MTPQ_SITE": str(tmp_path / "site"),
        "MTPQ_GPU_DRY_RUN": "1",
    }
    for call in calls:
        done = subprocess.run(
            ["bash", "-c", call["command"]], cwd=gpu_kit.ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    configured = json.loads((out / "dry-run.json").read_text())
    assert sorted(configured) == sorted(run.key for run in gpu_run.plan())
    stock = [config for key, config in configured.items() if key.startswith("unpatched:")]
    assert stock and all(config["vllm_file"].startswith(str(tmp_path / "site-stock")) for config in stock)


def test_a_missing_damaged_or_out_of_order_part_is_named_in_one_line(tmp_path, monkeypatch):
    kit = tmp_path / "kit"
    kit.mkdir()
    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(3 * 1000))
    monkeypatch.setattr(gpu_kit, "PART_BYTES", 1000)  # three small parts
    parts = gpu_kit.split(payload, kit)
    (kit / gpu_kit.MANIFEST).write_text(json.dumps({"parts": parts}))

    def install_error() -> str:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.gpu_kit",
                "install",
                "--kit",
                kit,
                "--site",
                tmp_path / "site",
            ],
            cwd=gpu_kit.ROOT,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1 and done.stdout == ""
        (line,) = done.stderr.splitlines()
        return line

    first, second = kit / "part-01", kit / "part-02"
    saved = second.read_bytes()
    second.unlink()
    assert install_error() == f"gpu_kit: part-02 is missing from {kit} (copy it with its host command)"
    second.write_bytes(saved[:-1] + bytes([saved[-1] ^ 0xFF]))  # always a changed byte
    assert install_error().startswith("gpu_kit: part-02 is damaged: sha256 ")
    second.write_bytes(first.read_bytes())
    first.write_bytes(saved)
    assert install_error() == "gpu_kit: part-01 holds part-02's bytes: parts out of order"
    first.write_bytes(second.read_bytes())
    second.write_bytes(saved)
    assert install_error().startswith(f"gpu_kit: the parts in {kit} are not a kit's tar stream (")
