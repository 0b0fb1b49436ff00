"""Crash safety: apply.py killed at its file-system steps loses nothing and the next ordinary run
finishes the job (a sample of each mode's steps here; benchmarks/fault_sweep.py kills at every one),
an interrupted run is told from a user's work, and two runs at once take turns."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import faults
from tests.conftest import ROOT, git

SAMPLE = 4  # steps spread over each run, besides its key steps


@pytest.mark.newest_release
@pytest.mark.parametrize("mode", faults.SCENARIOS)
def test_a_run_killed_at_a_file_system_step_loses_nothing(
    mode, pinned_tree, release_pin, release_series, tmp_path
):
    scenario = faults.SCENARIOS[mode](pinned_tree, release_pin, release_series, tmp_path)
    logged = faults.steps(scenario, tmp_path)
    points = faults.sample(logged, SAMPLE, scenario.key_steps)
    assert faults.sweep(scenario, points, logged, tmp_path) == []


def killed_while_switching(tree: Path, branch: str, tmp_path: Path) -> None:
    """Run apply.py on `tree` and kill it right after `git read-tree -m -u` moved the work tree onto the
    series' branch, before its next step (a kill inside that git run would depend on the machine's
    speed)."""
    log = tmp_path / "steps"
    command = [sys.executable, str(faults.KILLER), "0", str(log), str(faults.APPLY), "--vllm-src", str(tree)]
    subprocess.run(command, check=True, capture_output=True, start_new_session=True)
    git(tree, "checkout", "--quiet", "--force", "main")
    git(tree, "branch", "--quiet", "-D", branch)
    git(tree, "clean", "--quiet", "-fdx")
    step = next(i + 1 for i, line in enumerate(log.read_text().splitlines()) if "read-tree -m" in line)
    command[2] = str(step + 1)
    done = subprocess.run(command, capture_output=True, start_new_session=True)
    assert done.returncode == -9, done.stderr
    assert (tree / ".git" / "mtpq-run.json").exists()


@pytest.mark.newest_release
def test_an_interrupted_run_changed_since_is_refused_naming_the_change(
    run_apply, scratch_tree, release_pin, tmp_path
):
    killed_while_switching(scratch_tree, release_pin.branch, tmp_path)
    readme = scratch_tree / "README.md"
    readme.write_text(readme.read_text() + "a user's edit after the crash\n")
    journal = (scratch_tree / ".git" / "mtpq-run.json").read_bytes()
    done = run_apply("--vllm-src", str(scratch_tree))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "interrupted apply.py run" in done.stderr and "README.md" in done.stderr
    assert "a user's edit after the crash" in readme.read_text()
    assert (scratch_tree / ".git" / "mtpq-run.json").read_bytes() == journal


@pytest.mark.newest_release
def test_check_after_an_interrupted_run_says_so_and_changes_nothing(
    run_apply, scratch_tree, release_pin, snapshot, tmp_path
):
    killed_while_switching(scratch_tree, release_pin.branch, tmp_path)
    before = snapshot(scratch_tree)
    done = run_apply("--vllm-src", str(scratch_tree), "--check")
    assert done.returncode == 2 and "run apply.py without --check to put it back" in done.stderr
    assert snapshot(scratch_tree) == before


@pytest.mark.newest_release
def test_a_stale_git_lock_of_the_users_is_reported_and_left_alone(run_apply, scratch_tree, snapshot):
    lock = scratch_tree / ".git" / "index.lock"
    lock.touch()
    before = snapshot(scratch_tree)
    done = run_apply("--vllm-src", str(scratch_tree))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{lock} exists" in done.stderr and "nothing was changed" in done.stderr
    assert lock.exists() and snapshot(scratch_tree) == before


def run_while_locked(directory: Path, *args: str) -> subprocess.CompletedProcess:
    """apply.py started while another run (this test) holds `directory`'s lock; released after a while."""
    descriptor = os.open(directory, os.O_RDONLY)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "apply.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    assert process.poll() is None, "the second run did not wait"
    os.close(descriptor)
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.newest_release
def test_a_run_waits_while_another_works_on_the_tree(scratch_tree, release_series):
    done = run_while_locked(scratch_tree / ".git", "--vllm-src", str(scratch_tree))
    assert done.returncode == 0, done.stderr
    assert f"waiting for another apply.py run to finish with the git tree {scratch_tree}" in done.stderr
    assert done.stdout.count("  applied\n") == len(release_series.patches)


@pytest.mark.newest_release
def test_two_runs_at_once_on_one_tree_both_succeed(scratch_tree, release_series, release_pin):
    command = [sys.executable, str(ROOT / "apply.py"), "--vllm-src", str(scratch_tree)]
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    tables = sorted(stdout.count("  applied\n") for stdout, _ in outputs)
    assert tables == [0, len(release_series.patches)]  # the second found the series in place
    assert git(scratch_tree, "rev-parse", "--abbrev-ref", "HEAD") == release_pin.branch
    assert git(scratch_tree, "status", "--porcelain") == ""


@pytest.mark.newest_release
def test_two_installed_runs_at_once_take_turns(pinned_tree, release_pin, release_series, tmp_path):
    environment = faults.Environment(tmp_path / "env", pinned_tree, release_pin, release_series)
    done = run_while_locked(environment.site, "--installed", "--python", environment.python)
    assert done.returncode == 0, done.stderr
    assert "waiting for another apply.py run to finish with the vLLM installation" in done.stderr
    command = [sys.executable, str(ROOT / "apply.py"), "--installed", "--python", environment.python]
    runs = [subprocess.Popen(command + ["--revert"], stdout=subprocess.PIPE, text=True) for _ in "ab"]
    outputs = sorted(run.communicate(timeout=300)[0] for run in runs)
    assert [run.returncode for run in runs] == [0, 0]
    assert outputs[0] == "nothing to revert\n" and outputs[1].startswith("restored ")
