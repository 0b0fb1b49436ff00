"""Prove each patch's vLLM-native tests: they fail without the patch and pass with it.

Runs on an installed vLLM (a CPU test bed) and the series that serves its release. Overlay k is that
vLLM package as the series up to patch k leaves it (overlay 0: unpatched), built once from the
installation's original files (hard links; every file a patch changes is written anew) and put first
on PYTHONPATH. The tests run from the release's own tests/ tree (its sdist, with pyproject.toml for
the markers) plus the series' test files, under vLLM's own conftest, as upstream's CI runs them.

Patch k's tests must fail on overlay k-1 and pass on overlay k and on the whole series. A test that
passes without its patch cannot fail, and is reported as such.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mtpq.core import crashsafe, gittree, installed
from mtpq.core.download import cache_root, scratch_dir
from mtpq.core.errors import MtpqError
from mtpq.core.package_data import package_path
from mtpq.core.pin import Pin
from mtpq.core.series import Patch, Series
from mtpq.upstream.pull_requests import test_files

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
COLLECTION = "::<collection>"  # how the outcomes plugin names a test file that does not import
_PLUGIN_DIR = package_path("mtpq.upstream", "native_plugin")
_READY = ".mtpq-ready"


class ProofError(MtpqError, RuntimeError):
    """The tests could not be run as the proof needs (no report, another vLLM imported)."""


@dataclass
class Run:
    """One pytest run's outcome per test (pytest node id), the error line of each that did not pass,
    and the test files that did not even import."""

    outcomes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    uncollected: set[str] = field(default_factory=set)

    def of(self, paths: Iterable[str]) -> dict[str, str]:
        """The outcomes of the tests in these files."""
        prefixes = tuple(f"{path}::" for path in paths)
        return {test: outcome for test, outcome in self.outcomes.items() if test.startswith(prefixes)}


@dataclass(frozen=True)
class Proof:
    patch: str
    tests: tuple[str, ...]
    without: dict[str, str]  # test id -> outcome on the series without this patch
    with_patch: dict[str, str]
    whole_series: dict[str, str]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def failing_without(self) -> int:
        """How many of its tests do not pass without the patch (those of a file that does not even
        import then included)."""
        return len(self.with_patch) - sum(outcome == PASSED for outcome in self.without.values())


def prove(
    installation: installed.Installation,
    pin: Pin,
    series: Series,
    only: set[str] | None = None,
    jobs: int = 2,
) -> list[Proof]:
    """Run every patch's tests (or those of the patches named in `only`) on the overlays before and
    after it; one Proof per patch with tests."""
    packages = overlays(installation, series)
    workspace_source = tests_tree(pin, series)
    last = len(series.patches)
    chosen = [
        (number, patch)
        for number, patch in enumerate(series.patches, start=1)
        if test_files(patch) and (only is None or patch.name in only)
    ]
    runs_needed: dict[int, set[str]] = {}
    for number, patch in chosen:
        for overlay in (number - 1, number, last):
            runs_needed.setdefault(overlay, set()).update(test_files(patch))
    with scratch_dir("native-tests") as scratch:
        workspace = scratch / "vllm"
        shutil.copytree(workspace_source, workspace, copy_function=os.link)

        def run(overlay: int) -> tuple[int, Run]:
            return overlay, run_pytest(
                installation.python, workspace, packages[overlay], sorted(runs_needed[overlay])
            )

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            runs = dict(pool.map(run, sorted(runs_needed)))
    return [_judge(patch, runs[number - 1], runs[number], runs[last]) for number, patch in chosen]


def _judge(patch: Patch, without: Run, with_patch: Run, whole: Run) -> Proof:
    tests = tuple(test_files(patch))
    before, after, series_end = without.of(tests), with_patch.of(tests), whole.of(tests)
    problems = [f"{path} does not import with the patch" for path in tests if path in with_patch.uncollected]
    if not after:
        problems.append("no test collected with the patch")
    problems += [_failure(test, outcome, "with the patch", with_patch) for test, outcome in after.items()]
    problems += [_failure(test, outcome, "on the series", whole) for test, outcome in series_end.items()]
    problems = [problem for problem in problems if problem]
    problems += [
        f"{test} passes without the patch: it cannot fail" for test, o in before.items() if o == PASSED
    ]
    return Proof(patch.name, tests, before, after, series_end, tuple(problems))


def _failure(test: str, outcome: str, where: str, run: Run) -> str:
    """A problem line for a test that did not pass (with its error), or "" for one that did."""
    if outcome == PASSED:
        return ""
    error = run.errors.get(test)
    return f"{test} {outcome} {where}" + (f": {error}" if error else "")


def describe(proof: Proof) -> str:
    """One line per patch: how many of its tests fail without it and pass with it."""
    total = len(proof.with_patch)
    fails_without = proof.failing_without
    passes = sum(outcome == PASSED for outcome in proof.with_patch.values())
    whole = sum(outcome == PASSED for outcome in proof.whole_series.values())
    line = (
        f"{proof.patch}: {total} test(s); without it {fails_without}/{total} fail, "
        f"with it {passes}/{total} pass, on the whole series {whole}/{total} pass"
    )
    return line + "".join(f"\n    {problem}" for problem in proof.problems)


def _key(*parts: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        for item in part:
            digest.update(item + b"\0")
    return digest.hexdigest()[:12]


def overlays(installation: installed.Installation, series: Series) -> list[Path]:
    """PYTHONPATH entries holding the vllm package with the series' first k patches, k = 0..n."""
    manifest = installation.manifest()
    touched = sorted({*(manifest["files"] if manifest else ()), *installed.package_files(series)})
    root = cache_root() / "native-tests" / "overlays"
    version = installed.installed_version(installation)
    built: list[Path] = []
    for count in range(len(series.patches) + 1):
        applied = series.patches[:count]
        key = _key([str(installation.package_dir).encode()], [patch.data for patch in applied])
        overlay = root / f"vllm-{version}-{count}-{key}"
        if not (overlay / _READY).exists():
            with _building(overlay) as scratch:
                if count == 0:
                    _link_package(installation.package_dir, scratch)
                    for relative in touched:
                        _write_anew(
                            scratch / relative, installed.original_bytes(installation, relative, manifest)
                        )
                else:
                    _link_package(built[-1] / "vllm", scratch)
                    patch = applied[-1]
                    for relative in installed.package_files(patch):
                        if (scratch / relative).exists():
                            _write_anew(scratch / relative, (scratch / relative).read_bytes())
                    _apply(scratch, patch, "vllm/*")
        built.append(overlay)
    return built


@contextmanager
def _building(target: Path) -> Iterator[Path]:
    """A scratch directory beside `target`, renamed to it (marked ready) when the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with crashsafe.private_path(target.parent, ".building-", is_dir=True) as scratch:
        yield scratch
        (scratch / _READY).touch()
        shutil.rmtree(target, ignore_errors=True)
        scratch.rename(target)


def _link_package(package: Path, destination: Path) -> None:
    shutil.copytree(
        package, destination / "vllm", copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__")
    )


def _apply(directory: Path, patch: Patch, include: str) -> None:
    done = installed.git_apply(directory, patch, include=include)
    if done.returncode != 0:
        raise ProofError(
            f"{patch.name} does not apply to {directory}: {done.stderr.decode(errors='replace')}"
        )


def _write_anew(path: Path, data: bytes | None) -> None:
    """Replace a hard link with its own file, so the installation's copy is never written through."""
    path.unlink(missing_ok=True)
    if data is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def tests_tree(pin: Pin, series: Series) -> Path:
    """The release's tests/ and pyproject.toml from its sdist, with the series' test files applied."""
    key = _key([pin.version.encode()], [patch.data for patch in series.patches])
    tree = cache_root() / "native-tests" / f"tests-{pin.version}-{key}"
    if (tree / _READY).exists():
        return tree
    repo = gittree.open_repo(gittree.pinned_tree(pin))
    with _building(tree) as scratch:
        archive = scratch / "tests.tar"
        repo.git("archive", "--format=tar", "-o", str(archive), pin.tag, "tests", "pyproject.toml")
        with tarfile.open(archive) as tar:
            gittree.safe_extract(tar, scratch)
        archive.unlink()
        for patch in series.patches:
            # Test files, and what a patch changes of the suite itself (a fixture: its conftest).
            if any(path.startswith("tests/") for path in patch.files):
                _apply(scratch, patch, "tests/*")
    return tree


def run_pytest(python: str, workspace: Path, overlay: Path, arguments: list[str]) -> Run:
    """pytest in `workspace` (a vLLM tests tree) with the vllm package of `overlay` first on
    PYTHONPATH; a ProofError if it imported vllm from anywhere else."""
    name = f"{overlay.name}-{hashlib.sha256(repr(arguments).encode()).hexdigest()[:8]}"
    outcomes, origin, argfile = (workspace.parent / f"{name}.{ext}" for ext in ("jsonl", "origin", "args"))
    # One argument a line (pytest's @file): thousands of node ids fit no command line.
    argfile.write_text("".join(f"{argument}\n" for argument in arguments))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(overlay), str(_PLUGIN_DIR)]),
        "MTPQ_VLLM_ORIGIN_FILE": str(origin),
        "MTPQ_OUTCOMES_FILE": str(outcomes),
        # vLLM caches model-class checks by model file hash: one cache per overlay.
        "VLLM_CACHE_ROOT": str(overlay / ".vllm-cache"),
        # The Hub libraries do not try the Hub; vllm_bounds refuses any other host (and retries) at once.
        "HF_HUB_OFFLINE": "1",
    }
    command = [python, "-m", "pytest", "-p", "vllm_origin", "-p", "vllm_outcomes", "-p", "vllm_bounds"]
    command += ["-p", "no:cacheprovider"]
    command += ["-q", "--continue-on-collection-errors", f"@{argfile}"]
    done = subprocess.run(command, cwd=workspace, env=env, capture_output=True, text=True)
    if not outcomes.exists():
        output = (done.stdout + done.stderr)[-3000:]
        raise ProofError(f"pytest recorded no outcomes on {overlay.name} (exit {done.returncode}):\n{output}")
    imported = origin.read_text().strip() if origin.exists() else "nothing"
    if not imported.startswith(str(overlay / "vllm")):
        raise ProofError(f"the tests imported vllm from {imported}, not from {overlay}")
    return _read_outcomes(outcomes)


def _read_outcomes(path: Path) -> Run:
    run = Run()
    for line in path.read_text().splitlines():
        record = json.loads(line)
        test = record["test"]
        run.outcomes[test] = record["outcome"]
        run.seconds[test] = record["seconds"]
        if record["error"]:
            run.errors[test] = record["error"]
        if test.endswith(COLLECTION):
            run.uncollected.add(test.removesuffix(COLLECTION))
    return run
