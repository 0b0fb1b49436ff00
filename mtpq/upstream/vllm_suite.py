"""vLLM's own tests against the series: no test of the areas the series touches that passes on stock
vLLM may fail once the series is applied.

The areas are vLLM's configuration, speculative decoding, transformers utilities, model loader,
quantization and registry tests (AREAS), plus the tests named after each model file or model package
a patch changes. They come from the release's own tests/ tree (its sdist) and run on the CPU engine
of a test bed, under vLLM's conftest, with the vllm package first on PYTHONPATH as an overlay
(native_tests): the stock package, or the package with the whole series.

Which tests pass on stock is a property of the release and its engine, so it is recorded once
(`record`, into mtpq/upstream/vllm_suite_stock/<release>.json) rather than rerun every time: `check` runs
only the recorded tests, on the patched package, and lists every one that does not pass there with
its error. Zero is the only passing result.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mtpq.core import installed
from mtpq.core.download import scratch_dir, sha256_of
from mtpq.core.errors import MtpqError
from mtpq.core.package_data import package_path
from mtpq.core.pin import Pin
from mtpq.core.series import Series
from mtpq.upstream.native_tests import PASSED, Run, overlays, run_pytest, tests_tree
from mtpq.upstream.pull_requests import test_files

AREAS = (
    "tests/test_config.py",
    "tests/config",
    "tests/v1/spec_decode",
    "tests/transformers_utils",
    "tests/model_executor/model_loader",
    "tests/model_executor/test_*quantization*.py",
    "tests/models/test_registry.py",
)
# pytest processes at once: many of the tests wait rather than compute (see _run_sharded).
JOBS = 4
RECORDS = package_path("mtpq.upstream", "vllm_suite_stock")
_MODEL_DIRS = (("vllm", "model_executor", "models"), ("vllm", "models"))


class SuiteError(MtpqError, RuntimeError):
    """The check cannot be run as asked (no record for this release or engine, or a stale one)."""


@dataclass(frozen=True)
class Regression:
    test: str
    outcome: str  # on the patched package: "failed", "skipped" or "not run"
    error: str

    def __str__(self) -> str:
        return f"{self.test}: {self.outcome} with the series" + (f": {self.error}" if self.error else "")


@dataclass(frozen=True)
class Result:
    files: int
    tests: int  # the tests that pass on stock, all run on the patched package
    regressions: tuple[Regression, ...]
    seconds: float


def areas(series: Series) -> tuple[str, ...]:
    """AREAS, and tests/models/test_<name>*.py for each model file or package a patch changes."""
    names = set()
    for path in installed.package_files(series):
        parts = PurePosixPath(path).parts
        if parts[:3] == _MODEL_DIRS[0] and len(parts) == 4:
            names.add(PurePosixPath(path).stem)
        elif parts[:2] == _MODEL_DIRS[1] and len(parts) > 3:
            names.add(parts[2])
    return AREAS + tuple(f"tests/models/test_{name}*.py" for name in sorted(names))


def selected_files(tests_tree: Path, series: Series) -> list[str]:
    """The release's test files in the series' areas (the series' own test files left out)."""
    own = {path for patch in series.patches for path in test_files(patch)}
    found = set()
    for area in areas(series):
        for match in tests_tree.glob(area):
            candidates = match.rglob("test_*.py") if match.is_dir() else [match]
            found.update(path.relative_to(tests_tree).as_posix() for path in candidates)
    return sorted(found - own)


def record_path(pin: Pin) -> Path:
    return RECORDS / f"{pin.version}.json"


def record(installation: installed.Installation, pin: Pin, series: Series, jobs: int = JOBS) -> dict:
    """Run the selected files on the stock package; then run the tests that passed, by node id as
    `check` runs them, and keep those that pass again (a test that passes only beside others it
    follows is no evidence). Writes and returns the record."""
    started = time.monotonic()
    overlay = overlays(installation, series)[0]
    tree = tests_tree(pin, series)
    files = selected_files(tree, series)
    full = _run_sharded(installation, tree, overlay, {path: [path] for path in files}, {}, jobs)
    passed = sorted(test for test, outcome in full.outcomes.items() if outcome == PASSED)
    again = _run_sharded(installation, tree, overlay, _by_file(passed), full.seconds, jobs)
    stable = [test for test in passed if again.outcomes.get(test) == PASSED]
    counts = Counter(full.outcomes.values())
    data = {
        "release": pin.version,
        "engine_sha256": _engine_sha256(installation),
        "files": files,
        "outcomes": dict(sorted(counts.items())),
        "passed_alone_too": len(stable),
        "seconds": round(time.monotonic() - started),
        "passed": {test: round(full.seconds[test], 2) for test in stable},
    }
    RECORDS.mkdir(exist_ok=True)
    path = record_path(pin)
    scratch = path.with_suffix(".json.tmp")
    scratch.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(scratch, path)
    return data


def check(
    installation: installed.Installation,
    pin: Pin,
    series: Series,
    jobs: int = JOBS,
    stock: dict | None = None,
) -> Result:
    """Run the tests that pass on stock (`stock`, by default the release's record) on the package with
    the whole series."""
    started = time.monotonic()
    stock = stock or load_record(pin, installation)
    tree = tests_tree(pin, series)
    files = selected_files(tree, series)
    if unrecorded := sorted(set(files) - set(stock["files"])):
        raise SuiteError(
            f"the stock record {record_path(pin)} does not cover {', '.join(unrecorded)}: "
            f"record it again (python3 -m mtpq upstream suite --record --python {installation.python})"
        )
    tests = [test for test in stock["passed"] if test.partition("::")[0] in files]
    overlay = overlays(installation, series)[-1]
    patched = _run_sharded(installation, tree, overlay, _by_file(tests), stock["passed"], jobs)
    regressions = tuple(
        Regression(test, patched.outcomes.get(test, "not run"), patched.errors.get(test, ""))
        for test in tests
        if patched.outcomes.get(test) != PASSED
    )
    return Result(len(files), len(tests), regressions, time.monotonic() - started)


def load_record(pin: Pin, installation: installed.Installation) -> dict:
    path = record_path(pin)
    if not path.exists():
        raise SuiteError(
            f"no record of which of vLLM {pin.version}'s own tests pass on stock ({path}): "
            f"python3 -m mtpq upstream suite --record --python {installation.python}"
        )
    data = json.loads(path.read_text())
    engine = _engine_sha256(installation)
    if data["engine_sha256"] != engine:
        raise SuiteError(
            f"{path} was recorded on another vLLM {pin.version} engine "
            f"(vllm/_C*.so sha256 {data['engine_sha256'][:12]}, this one {engine[:12]}): record it again"
        )
    return data


def describe(result: Result) -> str:
    head = (
        f"vLLM's own tests: {result.tests} that pass on stock, in {result.files} files, run with the "
        f"series: {len(result.regressions)} fail ({result.seconds / 60:.1f} min)"
    )
    return "\n".join([head, *(f"  {regression}" for regression in result.regressions)])


def _engine_sha256(installation: installed.Installation) -> str:
    """The engine's compiled extension: what makes one CPU build's results differ from another's."""
    extensions = sorted(installation.package_dir.glob("_C.*so"))
    if not extensions:
        raise SuiteError(f"{installation.package_dir} has no compiled extension (vllm/_C*.so)")
    return sha256_of(extensions[0])


def _by_file(tests: list[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for test in tests:
        grouped[test.partition("::")[0]].append(test)
    return grouped


def _run_sharded(
    installation: installed.Installation,
    tree: Path,
    overlay: Path,
    arguments_by_file: dict[str, list[str]],
    seconds: dict[str, float],
    jobs: int,
) -> Run:
    """One pytest per shard, in parallel; a file's tests stay in one shard (module fixtures), and the
    shards are balanced by the seconds each test took before. Many of vLLM's tests wait on the Hub
    (retries with back-off) rather than compute, so more shards than cores pay off."""
    shards: list[list[str]] = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    # A file not timed yet weighs what its size suggests.
    weight = {
        path: sum(seconds.get(test, 0.0) for test in tests) or (tree / path).stat().st_size / 2000
        for path, tests in arguments_by_file.items()
    }
    for path in sorted(arguments_by_file, key=weight.__getitem__, reverse=True):
        lightest = load.index(min(load))
        shards[lightest] += arguments_by_file[path]
        load[lightest] += weight[path]
    shards = [shard for shard in shards if shard]
    merged = Run()
    with scratch_dir("vllm-suite") as scratch:
        workspace = scratch / "vllm"
        shutil.copytree(tree, workspace, copy_function=os.link)

        def run(shard: list[str]) -> Run:
            return run_pytest(installation.python, workspace, overlay, shard)

        with ThreadPoolExecutor(max_workers=max(len(shards), 1)) as pool:
            for part in pool.map(run, shards):
                merged.outcomes |= part.outcomes
                merged.errors |= part.errors
                merged.seconds |= part.seconds
                merged.uncollected |= part.uncollected
    return merged
