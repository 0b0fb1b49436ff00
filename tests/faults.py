"""Fault injection for every apply.py mode that writes: the real apply.py, its whole process group
SIGKILLed at one of its file-system steps (tests/kill_at_step.py), then the checks that the next
ordinary run finishes the job or puts everything back, and that nothing is lost or left behind.

A Scenario is a mode with its starting state; `steps` enumerates the steps of a clean run, and
`sweep` kills a fresh run at each step asked for and checks what is left. tests/test_crash_safety.py
runs a sample of steps, benchmarks/fault_sweep.py all of them.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtpq.core.download import fetch
from mtpq.core.installed import STATE_DIR_NAME
from mtpq.core.series import load_series

ROOT = Path(__file__).resolve().parent.parent
KILLER = ROOT / "tests" / "kill_at_step.py"
APPLY = ROOT / "apply.py"


def git(tree: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def apply(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """An ordinary apply.py run."""
    return subprocess.run(
        [sys.executable, str(APPLY), *args], capture_output=True, text=True, env={**os.environ, **env}
    )


def succeeded(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, f"exit {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, done.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fingerprint(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory`, by relative path."""
    return {
        str(path.relative_to(directory)): digest(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@dataclass
class Scenario:
    name: str
    args: list[str]  # of apply.py
    env: dict[str, str]
    reset: Callable[[], None]  # puts back the state every run starts from
    check: Callable[[], None]  # after a killed run: raises AssertionError if anything is lost or left
    key_steps: str = "$^"  # a pattern for the steps a short sweep always includes
    scratch: list[Path] = field(default_factory=list)  # directories that must hold no leftovers

    def no_leftovers(self) -> None:
        for directory in self.scratch:
            left = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
            assert not left, f"left in {directory}: {left}"


def steps(scenario: Scenario, work: Path) -> list[str]:
    """The file-system steps of a clean run from the starting state (which it must pass)."""
    scenario.reset()
    log = work / f"{scenario.name}.steps"
    done = _run(scenario, "0", log)
    succeeded(done)
    scenario.check()
    return log.read_text().splitlines()


def _run(scenario: Scenario, target: str, log: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **scenario.env, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, str(KILLER), target, str(log), str(APPLY), *scenario.args]
    return subprocess.run(command, capture_output=True, text=True, env=env, start_new_session=True)


def kill_and_check(
    scenario: Scenario, point: int, logged: list[str], work: Path, delay: str = ""
) -> tuple[bool, str | None]:
    """Kill a fresh run at step `point` (with `delay`: that long after the step, a subprocess,
    started) and check what is left. Returns whether the run was killed (else it ended first) and
    what failed, if anything."""
    scenario.reset()
    target = f"{point}+{delay}" if delay else str(point)
    done = _run(scenario, target, work / "killed.steps")
    label = f"{scenario.name} step {target} ({logged[point - 1][:150]})"
    if done.returncode not in (-signal.SIGKILL, 0):
        return False, f"{label}: the killed run exited {done.returncode}: {done.stderr[-1500:]}"
    try:
        scenario.check()
    except AssertionError as error:
        return done.returncode != 0, f"{label}: {error}"
    return done.returncode != 0, None


def sweep(scenario: Scenario, points: list[int], logged: list[str], work: Path) -> list[str]:
    """Kill a fresh run at each step in `points`; one line per failure."""
    checked = (kill_and_check(scenario, point, logged, work) for point in points)
    return [failure for _, failure in checked if failure]


def sample(logged: list[str], count: int, key_steps: str) -> list[int]:
    """`count` steps spread over the run (the last included), and every key step."""
    total = len(logged)
    spread = {max(1, round(total * (i + 1) / count)) for i in range(count)}
    keys = {index + 1 for index, line in enumerate(logged) if re.search(key_steps, line)}
    return sorted(spread | keys)


# --- git trees ---------------------------------------------------------------------------------


def _reset_tree(tree: Path, branch: str) -> None:
    """The tree on `main` as cloned, with no series branch and nothing a failed check left."""
    for leftover in [*tree.joinpath(".git").glob("*.lock"), tree / ".git" / "mtpq-run.json"]:
        leftover.unlink(missing_ok=True)
    shutil.rmtree(tree / ".git" / "rebase-apply", ignore_errors=True)
    git(tree, "checkout", "--quiet", "--force", "main")
    if git(tree, "branch", "--list", branch):
        git(tree, "branch", "--quiet", "-D", branch)
    git(tree, "clean", "--quiet", "-fdx")


def _clone(source: Path, tag: str, tree: Path) -> None:
    git(source, "clone", "--quiet", "--branch", tag, str(source), str(tree))
    git(tree, "checkout", "--quiet", "-b", "main")


def _check_tree(tree: Path, branch: str, target: str, main: str) -> None:
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD") == branch
    assert git(tree, "rev-parse", "HEAD") == target, "the series branch is not the series"
    assert git(tree, "rev-parse", "main") == main, "the user's branch moved"
    assert git(tree, "status", "--porcelain", "--ignored") == "", "the work tree is not clean"
    git_dir = tree / ".git"
    left = [p.name for p in (*git_dir.glob("*.lock"), git_dir / "mtpq-run.json", git_dir / "rebase-apply")]
    assert not [name for name in left if (git_dir / name).exists()], f"left in .git: {left}"
    assert not list((git_dir / "refs").rglob("*.lock")), "a ref lock was left"


def _git_tree_scenario(name: str, args: list[str], tree: Path, pin, cache: Path) -> Scenario:
    """A mode that puts the series on branch `pin.branch` of `tree` (branch main at the release)."""
    main = git(tree, "rev-parse", "main")
    env = {"MTPQ_CACHE_DIR": str(cache)}
    succeeded(apply(*args, env=env))
    target = git(tree, "rev-parse", "HEAD")

    def check() -> None:
        assert git(tree, "rev-parse", "main") == main, "the killed run moved the user's branch"
        succeeded(apply(*args, env=env))
        _check_tree(tree, pin.branch, target, main)
        scenario.no_leftovers()

    scenario = Scenario(
        name,
        args,
        env,
        reset=lambda: _reset_tree(tree, pin.branch),
        check=check,
        key_steps="mtpq-run.json|update-ref|read-tree -m|symbolic-ref",
        scratch=[cache / "tmp"],
    )
    return scenario


def vllm_src(pinned_tree: Path, pin, series, work: Path) -> Scenario:
    """`apply.py --vllm-src` on a user's checkout (branch main at the release)."""
    tree = work / "vllm"
    _clone(pinned_tree, pin.tag, tree)
    return _git_tree_scenario("vllm-src", ["--vllm-src", str(tree)], tree, pin, work / "cache")


def managed_tree(pinned_tree: Path, pin, series, work: Path) -> Scenario:
    """`apply.py --vllm V`: the managed tree in the cache, from its baseline."""
    cache = work / "cache"
    tree = cache / "src" / f"vllm-{pin.version}"
    _clone(pinned_tree, pin.tag, tree)
    return _git_tree_scenario("managed-tree", ["--vllm", pin.version], tree, pin, cache)


def export(pinned_tree: Path, pin, series, work: Path) -> Scenario:
    """`apply.py --export` over a series directory whose files all change and one goes."""
    tree, cache, patches = work / "vllm", work / "cache", work / "patches"
    _clone(pinned_tree, pin.tag, tree)
    env = {"MTPQ_CACHE_DIR": str(cache)}
    succeeded(apply("--vllm-src", str(tree), env=env))
    initial = work / "patches-before-export"
    shutil.copytree(series.directory, initial)
    for patch in series.patches:  # each file differs from what the export writes
        (initial / patch.name).write_bytes(patch.data + b"\n")
    stale = series.patches[0].data.replace(b"Subject: [PATCH] ", b"Subject: [PATCH] stale: ", 1)
    (initial / "0099-stale.patch").write_bytes(stale)  # matches no commit: the export drops it
    with (initial / "series").open("a") as series_file:
        series_file.write("0099-stale.patch\n")
    expected = fingerprint(series.directory)
    before = fingerprint(initial)
    args = ["--vllm-src", str(tree), "--export", "--base", pin.tag, "--patches", str(patches)]

    def reset() -> None:
        shutil.rmtree(patches, ignore_errors=True)
        shutil.copytree(initial, patches)

    def check() -> None:
        loaded = load_series(patches)  # any later run: the old series or the new one, whole
        assert fingerprint(patches) in (before, expected), "the series directory is a mix"
        assert [p.name for p in loaded.patches] in (
            [p.name for p in series.patches] + ["0099-stale.patch"],
            [p.name for p in series.patches],
        )
        succeeded(apply(*args, env=env))
        assert fingerprint(patches) == expected
        assert not [p.name for p in patches.iterdir() if p.name.startswith(".")], "export leftovers"
        scenario.no_leftovers()

    scenario = Scenario(
        "export", args, env, reset, check, key_steps=r"\.mtpq-export|/series$", scratch=[cache / "tmp"]
    )
    return scenario


# --- installed vLLM ----------------------------------------------------------------------------


class Environment:
    """A bare virtualenv whose site-packages holds the baseline vllm files the series touches."""

    def __init__(self, root: Path, pinned_tree: Path, pin, series) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
        self.python = str(root / "bin" / "python")
        query = [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        self.site = Path(subprocess.run(query, check=True, capture_output=True, text=True).stdout.strip())
        for relative in ("vllm/__init__.py", "vllm/_version.py", *series.files):
            show = subprocess.run(
                ["git", "-C", str(pinned_tree), "show", f"{pin.tag}:{relative}"], capture_output=True
            )
            if show.returncode == 0:  # else a file the series creates
                (self.site / relative).parent.mkdir(parents=True, exist_ok=True)
                (self.site / relative).write_bytes(show.stdout)

    def load(self, saved: Path) -> None:
        shutil.rmtree(self.site)
        shutil.copytree(saved, self.site)

    def save(self, saved: Path) -> None:
        shutil.rmtree(saved, ignore_errors=True)
        shutil.copytree(self.site, saved)


def _installations(pinned_tree: Path, pin, series, work: Path):
    """Two environments (one to revert a copy of a killed state in) and the pristine site."""
    first = Environment(work / "env", pinned_tree, pin, series)
    second = Environment(work / "env-copy", pinned_tree, pin, series)
    pristine = work / "pristine-site"
    first.save(pristine)
    return first, second, pristine


def _patched(environment: Environment, env: dict[str, str]) -> dict[str, str]:
    succeeded(apply("--installed", "--python", environment.python, env=env))
    return {path: sha for path, sha in fingerprint(environment.site).items() if path.startswith("vllm/")}


def installed(pinned_tree: Path, pin, series, work: Path) -> Scenario:
    """`apply.py --installed` on an unpatched vLLM."""
    return _installed(pinned_tree, pin, series, work, earlier_series=None)


def installed_over_earlier_series(pinned_tree: Path, pin, series, work: Path) -> Scenario:
    """`apply.py --installed` on a vLLM that an earlier series (this one without its last patch)
    patched: the files go from one patched version to another."""
    earlier = work / "earlier-series"
    shutil.copytree(series.directory, earlier)
    last = series.patches[-1].name
    (earlier / last).unlink()
    lines = (earlier / "series").read_text().splitlines()
    (earlier / "series").write_text("".join(f"{line}\n" for line in lines if line.strip() != last))
    return _installed(pinned_tree, pin, series, work, earlier_series=earlier)


def _installed(pinned_tree: Path, pin, series, work: Path, earlier_series: Path | None) -> Scenario:
    """After a kill, `--revert` (of a copy) must give back the pristine files, and `--installed`
    must finish the job."""
    environment, copy, pristine = _installations(pinned_tree, pin, series, work)
    cache = work / "cache"
    env = {"MTPQ_CACHE_DIR": str(cache)}
    expected = fingerprint(pristine)
    patched = _patched(environment, env)
    environment.load(pristine)
    if earlier_series is not None:
        args = ["--installed", "--python", environment.python, "--patches", str(earlier_series)]
        succeeded(apply(*args, env=env))
    start = work / "start-site"
    environment.save(start)

    def check() -> None:
        copy.load(environment.site)
        succeeded(apply("--installed", "--python", copy.python, "--revert", env=env))
        assert fingerprint(copy.site) == expected, "--revert did not give back the original files"
        succeeded(apply("--installed", "--python", environment.python, env=env))
        succeeded(apply("--installed", "--python", environment.python, "--verify", env=env))
        now = fingerprint(environment.site)
        assert {path: sha for path, sha in now.items() if path.startswith("vllm/")} == patched
        assert not [path for path in now if path.startswith(STATE_DIR_NAME) and "mtpq-tmp" in path]
        succeeded(apply("--installed", "--python", environment.python, "--revert", env=env))
        assert fingerprint(environment.site) == expected
        scenario.no_leftovers()

    scenario = Scenario(
        "installed" if earlier_series is None else "installed-over-earlier-series",
        ["--installed", "--python", environment.python],
        env,
        reset=lambda: environment.load(start),
        check=check,
        key_steps="manifest",
        scratch=[cache / "tmp"],
    )
    return scenario


def revert(pinned_tree: Path, pin, series, work: Path) -> Scenario:
    """`apply.py --installed --revert` of a patched vLLM; after a kill, `--revert` must give back the
    pristine files, and `--installed` (on a copy) must find the series in place or put it there."""
    environment, copy, pristine = _installations(pinned_tree, pin, series, work)
    cache = work / "cache"
    env = {"MTPQ_CACHE_DIR": str(cache)}
    expected = fingerprint(pristine)
    patched = _patched(environment, env)
    start = work / "start-site"
    environment.save(start)

    def check() -> None:
        copy.load(environment.site)
        succeeded(apply("--installed", "--python", copy.python, env=env))
        succeeded(apply("--installed", "--python", copy.python, "--verify", env=env))
        now = fingerprint(copy.site)
        assert {path: sha for path, sha in now.items() if path.startswith("vllm/")} == patched
        succeeded(apply("--installed", "--python", environment.python, "--revert", env=env))
        assert fingerprint(environment.site) == expected, "--revert did not give back the original files"
        scenario.no_leftovers()

    scenario = Scenario(
        "revert",
        ["--installed", "--python", environment.python, "--revert"],
        env,
        reset=lambda: environment.load(start),
        check=check,
        key_steps=f"manifest|{STATE_DIR_NAME}$",
        scratch=[cache / "tmp"],
    )
    return scenario


# --- wheel -------------------------------------------------------------------------------------


def wheel(pinned_tree: Path, pin, series, work: Path, arch: str = "x86_64") -> Scenario:
    """`apply.py --wheel`: after a kill, the next build gives the same bytes and nothing else."""
    cache, out = work / "cache", work / "dist"
    official = fetch(pin.wheel(arch))
    (cache / "downloads").mkdir(parents=True)
    os.link(official, cache / "downloads" / official.name)
    _clone(pinned_tree, pin.tag, cache / "src" / f"vllm-{pin.version}")
    env = {"MTPQ_CACHE_DIR": str(cache)}
    args = ["--wheel", "--arch", arch, "--vllm", pin.version, "--out", str(out)]
    built = apply(*args, env=env)
    succeeded(built)
    reference = Path(built.stdout.strip().splitlines()[-1])
    expected = {reference.name: digest(reference)}

    def check() -> None:
        succeeded(apply(*args, env=env))
        assert fingerprint(out) == expected, "the rebuilt wheel differs, or something else is in --out"
        scenario.no_leftovers()

    scenario = Scenario(
        "wheel",
        args,
        env,
        reset=lambda: shutil.rmtree(out, ignore_errors=True),
        check=check,
        key_steps=r"\.part",
        scratch=[cache / "tmp"],
    )
    return scenario


SCENARIOS = {
    "vllm-src": vllm_src,
    "managed-tree": managed_tree,
    "export": export,
    "installed": installed,
    "installed-over-earlier-series": installed_over_earlier_series,
    "revert": revert,
    "wheel": wheel,
}
