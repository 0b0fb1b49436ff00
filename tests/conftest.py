"""Shared fixtures: the test-bed target and the releases its series serves, pinned trees, scratch
clones of them, apply.py runs and vLLM probes.

A session runs for one target (tests/run.py sets MTPQ_TARGET; run directly, it is the vLLM this
interpreter has, or with no vLLM the newest test-bed target): a pinned release whose CPU engine the
behaviour tests run. Tests that take `release_pin` run once for every release the session covers
(served_pins), each with its own series (`release_series`).

Tests that need vLLM itself are marked `engine`: those that need the test bed (its vLLM, torch, the CPU
engine) or a release's sources or wheel, or build the images. This module marks them by module and by
fixture; a test that reaches a release's sources through mtpq's own code carries the mark itself.
`python -m pytest -m "not engine"` runs the others, in about a minute, where no vLLM is installed
(README, "Tests").
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from mtpq.core import gittree, installed
from mtpq.core.pin import load_pins, version_key
from mtpq.core.series import load_series
from tests.cpu_features import cpu_moe_kernels
from tests.probing import ProbeError, run_probe
from tests.run import ensure_unpatched_vllm
from tests.run import targets as engine_targets

ROOT = Path(__file__).resolve().parent.parent
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None

# Test modules that need vLLM throughout: they import it or torch at the top, read a release's sources
# there (test_drafter_matrix.py), apply the series to its trees and installations, or build the images
# around it (root and buildah too). Where no vLLM is installed they are not collected.
ENGINE_MODULES = [
    "test_apply_tree.py",
    "test_checkpoints.py",
    "test_cpu_features.py",
    "test_crash_safety.py",
    "test_doctor_copies.py",
    "test_drafter_matrix.py",
    "test_dsv4_bf16_mtp.py",
    "test_dsv4_mtp_ignore_entries.py",
    "test_e2e_doctor.py",
    "test_e2e_mtp_acceptance.py",
    "test_e2e_online_draft_quantization.py",
    "test_e2e_qwen3_5.py",
    "test_e2e_tensor_parallel.py",
    "test_engine_limits.py",
    "test_images.py",
    "test_installed.py",
    "test_mla_stand_in.py",
    "test_mtp_checkpoint_detector.py",
    "test_mtp_checkpoint_properties.py",
    "test_mtp_draft_construction.py",
    "test_mtp_families.py",
    "test_speculative_config.py",
    "test_step3p5_mtp.py",
]
# The fixtures that need vLLM: the test bed's (installed_vllm, unpatched_vllm), torch's
# (engineered_checkpoint), a release's source tree (pinned_tree) or wheel (test_wheel.py's `wheel`). A
# test that uses one, directly or through another fixture, is `engine` too.
ENGINE_FIXTURES = {"installed_vllm", "unpatched_vllm", "engineered_checkpoint", "pinned_tree", "wheel"}


def target_version() -> str:
    if explicit := os.environ.get("MTPQ_TARGET"):
        return explicit
    if not VLLM_INSTALLED:
        return engine_targets()[-1].version
    return installed.installed_version(installed.find_installation(sys.executable))


def is_newest_target() -> bool:
    return target_version() == engine_targets()[-1].version


# Tensor parallelism is shown on the newest test-bed target only (each such engine start takes
# about a minute here), and so are crash safety, which does not depend on the series, the upstream
# pull requests, which are the newest series', and vLLM's own suite, recorded for that release only
# (mtpq/upstream/vllm_suite_stock/).
NEWEST_TARGET_ONLY = [
    "test_e2e_tensor_parallel.py",
    "test_crash_safety.py",
    "test_upstream.py",
    "test_vllm_suite.py",
]
collect_ignore = [
    *([] if is_newest_target() else NEWEST_TARGET_ONLY),
    *([] if VLLM_INSTALLED else ENGINE_MODULES),
]


# The architectures whose end-to-end runs the session's tests ask for (None: every one).
ENGINE_RUN_ARCHITECTURES = pytest.StashKey()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in ENGINE_MODULES or ENGINE_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.engine)
    config.stash[ENGINE_RUN_ARCHITECTURES] = requested_architectures(items)


def requested_architectures(items) -> frozenset[str] | None:
    """The architectures of the cases the collected end-to-end tests are parametrized with, so that a
    selection (`-k mimo`, node ids) runs only their engine runs; None where one of those tests names no
    case (it may ask for any run)."""
    from tests.e2e_cases import architecture_of

    requested = set()
    for item in items:
        if "engine_run" not in item.fixturenames:
            continue
        params = item.callspec.params.values() if hasattr(item, "callspec") else ()
        named = {architecture_of(value) for value in params} - {None}
        if not named:
            return None
        requested |= named
    return frozenset(requested)


def served_pins() -> list:
    """The pinned releases this session covers, oldest first: those its target's series serves, and,
    on the newest test bed, the newer releases no CPU engine can test (0.33.0 has no CPU build)."""
    pins = load_pins()
    target = pins[target_version()]
    newest_engine = engine_targets()[-1]
    return [
        pin
        for pin in pins.values()
        if pin.series_name == target.series_name
        or (target == newest_engine and version_key(pin.version) > version_key(target.version))
    ]


def pytest_addoption(parser):
    parser.addoption(
        "--update-drafter-matrix",
        action="store_true",
        help="tests/test_drafter_matrix.py records the rows it finds for this target in "
        "mtpq/upstream/drafter_matrix.json and regenerates README.md's drafter tables from the record",
    )


def pytest_generate_tests(metafunc):
    if "release_pin" in metafunc.fixturenames:
        releases = served_pins()
        if metafunc.definition.get_closest_marker("newest_release"):
            releases = releases[-1:]
        metafunc.parametrize("release_pin", releases, ids=[p.version for p in releases], scope="session")


@pytest.fixture(scope="session")
def pins():
    return load_pins()


@pytest.fixture(scope="session")
def pin():
    """The target: the pinned release whose CPU engine this session's vLLM is."""
    return load_pins()[target_version()]


@pytest.fixture(scope="session")
def series(pin):
    return load_series(pin.series_dir)


@pytest.fixture(scope="session")
def release_series(release_pin):
    return load_series(release_pin.series_dir)


@pytest.fixture(scope="session")
def newest_series(newest_pin):
    return load_series(newest_pin.series_dir)


@pytest.fixture(scope="session")
def newest_pin():
    """The newest release the session covers: the one wheels and images are built for."""
    return served_pins()[-1]


@pytest.fixture(scope="session")
def installed_vllm() -> installed.Installation:
    """The test bed's vLLM: this interpreter's (tests/run.py patches it with `apply.py --installed`)."""
    return installed.find_installation(sys.executable)


@pytest.fixture(scope="session")
def engine_series(installed_vllm):
    """The test bed's vLLM, its pin and the series serving its release."""
    pin = load_pins()[target_version()]
    return installed_vllm, pin, load_series(pin.series_dir)


@pytest.fixture(scope="session")
def pinned_tree(release_pin) -> Path:
    """The cached git repository of a served release's sdist (baseline commit tagged v<version>)."""
    return gittree.pinned_tree(release_pin)


def git(tree: Path, *args: str, **kwargs) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), *args], check=True, capture_output=True, text=True, **kwargs
    ).stdout.strip()


@pytest.fixture
def scratch_tree(pinned_tree, release_pin, tmp_path) -> Path:
    """A private clone of a served release's pinned tree, on branch `main` at the baseline tag."""
    tree = tmp_path / "vllm"
    git(pinned_tree, "clone", "--quiet", "--branch", release_pin.tag, str(pinned_tree), str(tree))
    git(tree, "checkout", "--quiet", "-b", "main")
    return tree


@dataclass(frozen=True)
class TreeState:
    head: str
    branch: str
    porcelain: str
    worktree: str  # tree id of every non-ignored file as it is on disk
    branches: str


def tree_state(tree: Path, tmp_path: Path) -> TreeState:
    index = {"GIT_INDEX_FILE": str(tmp_path / "snapshot-index")}
    env = {**os.environ, **index}
    git(tree, "add", "--all", "--force", env=env)
    return TreeState(
        head=git(tree, "rev-parse", "HEAD"),
        branch=git(tree, "rev-parse", "--abbrev-ref", "HEAD"),
        porcelain=git(tree, "status", "--porcelain"),
        worktree=git(tree, "write-tree", env=env),
        branches=git(tree, "branch", "--list"),
    )


@pytest.fixture
def snapshot(tmp_path):
    return lambda tree: tree_state(tree, tmp_path)


@pytest.fixture(scope="session")
def run_apply():
    """Run apply.py as a user would; returns the CompletedProcess (text, both streams)."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "apply.py"), *args],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
        )

    return run


@pytest.fixture(scope="session")
def unpatched_vllm() -> Path:
    """The engine wheel's vllm package, untouched; put first on PYTHONPATH to run unpatched."""
    if explicit := os.environ.get("MTPQ_UNPATCHED_VLLM"):
        return Path(explicit)
    return ensure_unpatched_vllm(load_pins()[target_version()])


@pytest.fixture(scope="session")
def stock_result(pin, installed_vllm):
    """`stock_result(case)`: stock vLLM's outcome on this test bed's target and this CPU."""
    kernels = cpu_moe_kernels()
    return lambda case: case.stock_result(pin.version, kernels)


@pytest.fixture(scope="session")
def vllm_probe(series, unpatched_vllm, installed_vllm):
    """Run tests/probes/<name>.py under the patched or unpatched vLLM; return its JSON verdict.

    The patched vLLM is this interpreter's site-packages (patched by tests/run.py through
    `apply.py --installed`); the fixture refuses to run if that is not fully in place.
    """
    if not all(r.ok for r in installed.verify_installed(installed_vllm, series)):
        pytest.fail(f"the series is not in place in {installed_vllm.package_dir}: run `python tests/run.py`")
    cache: dict[tuple, dict] = {}

    def probe(name: str, variant: str, *args: str) -> dict:
        key = (name, variant, args)
        if key not in cache:
            try:
                cache[key] = run_probe(name, variant, unpatched_vllm, installed_vllm.package_dir, *args)
            except ProbeError as error:
                pytest.fail(str(error))
        return cache[key]

    return probe


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A PEP 503 index on loopback with an empty cache. `index.serve(project, name, data)` adds a file to
    the project's page with its sha256; `sha256=` publishes another one instead, as a tampered index would."""
    root = tmp_path / "index"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # a short poll interval: shutdown() waits for it at every teardown
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    published: dict[str, dict[str, str]] = {}  # project -> file name -> the sha256 its page gives

    class Index:
        url = f"http://127.0.0.1:{server.server_port}"
        cache = tmp_path / "cache"

        @staticmethod
        def serve(project: str, filename: str, data: bytes, sha256: str | None = None) -> None:
            page = root / project
            page.mkdir(exist_ok=True)
            (page / filename).write_bytes(data)
            files = published.setdefault(project, {})
            files[filename] = sha256 or hashlib.sha256(data).hexdigest()
            anchors = [f'<a href="{name}#sha256={digest}">{name}</a>' for name, digest in files.items()]
            (page / "index.html").write_text("\n".join(anchors))

    monkeypatch.setenv("MTPQ_INDEX_URL", Index.url)
    monkeypatch.setenv("MTPQ_CACHE_DIR", str(Index.cache))
    yield Index
    server.shutdown()


@pytest.fixture(scope="session")
def engineered_checkpoint(tmp_path_factory):
    """checkpoints.CheckpointStore for this session: each engineered (or grafted) checkpoint once."""
    from tests import checkpoints

    store = checkpoints.CheckpointStore(tmp_path_factory.mktemp, stock_vllm=target_version())

    def make(quant: str, arch: str = "mimo", graft: str | None = None, **options) -> Path:
        try:
            return store(quant, arch, graft, **options)
        except checkpoints.GraftFailed as error:
            pytest.fail(str(error))

    make.grafts = store.grafts
    return make


@pytest.fixture(scope="session")
def engine_run(request, vllm_probe, engineered_checkpoint):
    """`engine_run(EngineRun)`: that run's report (e2e_cases.py). The first request for a run makes
    every planned run of its kind (variant and tensor-parallel size) in one probe process, on one rank
    both variants' at once; a run without MTP, in no plan, runs alone."""
    from tests.e2e_cases import engine_plan, engine_specs, of_architectures

    architectures = request.config.stash[ENGINE_RUN_ARCHITECTURES]
    plan = of_architectures(engine_plan(target_version(), newest_target=is_newest_target()), architectures)
    reports: dict[str, dict] = {}

    def checkpoint_of(case):
        return engineered_checkpoint(case.quant, case.arch, **case.options)

    def batches_with(requested) -> dict[tuple, dict]:
        """The batches the first request for `requested` runs, by kind: its own kind's planned runs, and
        on one rank the other variant's too (two one-rank probes at once keep both of the development
        machine's cores busy: 294 s sequential, 215 s together, for MiMo INT8 on vLLM 0.22.1)."""
        if requested.speculative is None:
            return {requested.kind: engine_specs([requested], checkpoint_of)}
        kinds = {requested.kind}
        if requested.tensor_parallel_size == 1:
            kinds |= {r.kind for r in plan if r.tensor_parallel_size == 1}
        batches = {kind: engine_specs([r for r in plan if r.kind == kind], checkpoint_of) for kind in kinds}
        if requested.key not in batches[requested.kind]:
            pytest.fail(f"{requested.key} is not in e2e_cases.engine_plan()")
        return {kind: batch for kind, batch in batches.items() if not batch.keys() <= reports.keys()}

    def run(requested) -> dict:
        if reason := requested.case.cannot_run(target_version()):
            pytest.skip(reason)
        if requested.key not in reports:
            # checkpoints are made here, in this thread (engine_specs), before any probe starts
            batches = batches_with(requested)
            with ThreadPoolExecutor() as pool:
                done = pool.map(
                    lambda kind: vllm_probe("engine_acceptance", kind[0], json.dumps(batches[kind])), batches
                )
                for report in done:
                    reports.update(report["runs"])
        return reports[requested.key]

    return run


@pytest.fixture
def series_copy(tmp_path):
    """`series_copy(series)`: that series' directory in a private copy of patches/ (sibling series
    included, as a series may list their files), for a test to damage or export into."""

    def copy(series) -> Path:
        patches = tmp_path / "patches"
        if not patches.exists():
            shutil.copytree(series.directory.parent, patches)
        return patches / series.directory.name

    return copy


@pytest.fixture
def checkpoint_copy(tmp_path):
    """`checkpoint_copy(source)`: a private copy of a checkpoint directory for a test to damage."""

    def copy(source: Path) -> Path:
        target = tmp_path / source.name
        shutil.copytree(source, target)
        return target

    return copy


@pytest.fixture(scope="session")
def series_design(series) -> str:
    """The series whose design this one's behaviour follows, by directory name ("v0.22.1", "v0.33.0"):
    what per-series expectations key on. A series built from a sibling's patches plus a backport (the
    v0.32.0 series lists v0.33.0's) answers with that sibling's name."""
    siblings = {patch.path.parent.name for patch in series.shared_patches}
    (design,) = siblings or {series.directory.name}
    return design


@pytest.fixture(scope="session")
def mtp_drafts(vllm_probe):
    """`mtp_drafts(variant)`: the verdict of tests/probes/mtp_drafts.py, every draft construction and
    loading section of one vLLM variant (one probe process per variant and session)."""
    return lambda variant: vllm_probe("mtp_drafts", variant)
