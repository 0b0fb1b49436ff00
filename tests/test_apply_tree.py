"""apply.py on vLLM git checkouts: apply, re-run, check, refuse, conflict, rebase, export."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpq.core.pin import load_pins, newest_pin
from mtpq.core.series import load_series
from tests.conftest import ROOT, git


def statuses(stdout: str) -> dict[str, str]:
    """Patch name -> status, from apply.py's table (indented, names padded to one width)."""
    return dict(line.split(maxsplit=1) for line in stdout.splitlines() if line.startswith("  "))


def test_series_applies_one_commit_per_patch_keeping_author_and_message(
    run_apply, scratch_tree, release_series, release_pin
):
    done = run_apply("--vllm-src", str(scratch_tree))
    assert done.returncode == 0, done.stderr
    for patch in release_series.patches:
        assert statuses(done.stdout)[patch.name] == "applied"
    assert git(scratch_tree, "rev-parse", "--abbrev-ref", "HEAD") == release_pin.branch
    log = git(
        scratch_tree, "log", "--reverse", "--format=%an <%ae>%x09%s", f"{release_pin.tag}..HEAD"
    ).splitlines()
    assert log == [f"{patch.author}\t{patch.subject}" for patch in release_series.patches]
    assert git(scratch_tree, "status", "--porcelain") == ""


def test_second_run_on_the_patched_branch_reports_already_upstream(run_apply, scratch_tree, release_series):
    assert run_apply("--vllm-src", str(scratch_tree)).returncode == 0
    head = git(scratch_tree, "rev-parse", "HEAD")
    again = run_apply("--vllm-src", str(scratch_tree))
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already upstream\n") == len(release_series.patches)
    assert git(scratch_tree, "rev-parse", "HEAD") == head


def test_a_branch_blocking_the_series_branch_name_is_a_clear_error(
    run_apply, scratch_tree, snapshot, release_pin
):
    git(scratch_tree, "branch", release_pin.branch.split("/")[0])  # "mtpq" makes "mtpq/v0.22.1" impossible
    before = snapshot(scratch_tree)
    done = run_apply("--vllm-src", str(scratch_tree))
    assert done.returncode == 2
    assert f"cannot create branch {release_pin.branch}" in done.stderr and "--branch NAME" in done.stderr
    assert "Traceback" not in done.stderr
    assert snapshot(scratch_tree) == before


def test_check_is_a_dry_run(run_apply, scratch_tree, snapshot, release_series):
    before = snapshot(scratch_tree)
    done = run_apply("--vllm-src", str(scratch_tree), "--check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("  would apply\n") == len(release_series.patches)
    assert "  applied\n" not in done.stdout and "(--check: nothing was changed)" in done.stdout
    assert snapshot(scratch_tree) == before


def test_dirty_tree_is_refused_and_left_untouched(run_apply, scratch_tree, snapshot, release_series):
    path = next(path for path in release_series.files if (scratch_tree / path).exists())
    touched = scratch_tree / path
    touched.write_text(touched.read_text() + "# a user's unsaved work\n")
    before = snapshot(scratch_tree)
    done = run_apply("--vllm-src", str(scratch_tree))
    assert done.returncode == 2
    assert "uncommitted changes" in done.stderr and path in done.stderr
    assert snapshot(scratch_tree) == before


def _inject_conflict(tree: Path, release_series):
    """Commit a change to a line the first patch that edits an existing file removes, so that patch
    cannot apply; returns the patch and the file."""
    for patch in release_series.patches:
        for path in patch.files:
            hunks = patch.path.read_text().split(f"+++ b/{path}\n", 1)[1].split("\ndiff --git ", 1)[0]
            removed = next((line[1:] for line in hunks.splitlines() if line.startswith("-")), None)
            if removed is not None and (tree / path).exists():
                target = tree / path
                target.write_text(
                    target.read_text().replace(removed, removed + "  # changed by someone else", 1)
                )
                git(tree, "commit", "--quiet", "-am", "local change")
                return patch, path
    raise AssertionError("no patch of the series removes a line of an existing file")


def test_conflict_is_reported_and_the_tree_is_restored_exactly(
    run_apply, scratch_tree, snapshot, release_series
):
    patch, path = _inject_conflict(scratch_tree, release_series)
    before = snapshot(scratch_tree)
    done = run_apply("--vllm-src", str(scratch_tree))
    assert done.returncode == 1
    assert statuses(done.stdout)[patch.name].startswith("conflict: ") and path in done.stdout
    assert "Nothing was changed" in done.stderr and "--rebase" in done.stderr
    assert snapshot(scratch_tree) == before


@pytest.mark.newest_release  # a 3-way merge needs the blobs the patches were made against
def test_rebase_keeps_the_conflict_for_resolving(run_apply, scratch_tree, release_series, release_pin):
    _, path = _inject_conflict(scratch_tree, release_series)
    done = run_apply("--vllm-src", str(scratch_tree), "--rebase")
    assert done.returncode == 1
    assert "git am --continue" in done.stderr
    assert git(scratch_tree, "rev-parse", "--abbrev-ref", "HEAD") == release_pin.branch
    assert (scratch_tree / ".git" / "rebase-apply").is_dir()
    # Resolve by taking the patch's side of the conflicting file, then finish the series.
    git(scratch_tree, "checkout", "--theirs", "--", path)
    git(scratch_tree, "add", path)
    git(scratch_tree, "am", "--continue")
    commits = git(scratch_tree, "rev-list", "--count", "main..HEAD")
    assert int(commits) == len(release_series.patches)


@pytest.mark.newest_release
def test_export_after_a_rebase_rewrites_the_series(run_apply, scratch_tree, release_series, series_copy):
    _, path = _inject_conflict(scratch_tree, release_series)
    run_apply("--vllm-src", str(scratch_tree), "--rebase")
    git(scratch_tree, "checkout", "--theirs", "--", path)
    git(scratch_tree, "add", path)
    git(scratch_tree, "am", "--continue")
    patches = series_copy(release_series)
    # The branch the series was rebased onto ("main", with the conflicting change) is the new base.
    exported = run_apply(
        "--vllm-src", str(scratch_tree), "--export", "--base", "main", "--patches", str(patches)
    )
    assert exported.returncode == 0, exported.stderr
    assert sorted(p.name for p in patches.glob("*.patch")) == sorted(p.name for p in release_series.patches)
    assert [p.name for p in load_series(patches).patches] == [p.name for p in release_series.patches]
    assert (patches / "series").read_text() == (release_series.directory / "series").read_text()


def test_export_refuses_a_series_that_lists_another_series_files(run_apply, scratch_tree, series_copy, pins):
    every_series = [load_series(pin.series_dir) for pin in pins.values()]
    shared = next(series for series in every_series if series.shared_patches)
    patches = series_copy(shared)
    before = {path: path.read_bytes() for path in patches.parent.rglob("*") if path.is_file()}
    done = run_apply("--vllm-src", str(scratch_tree), "--export", "--base", "main", "--patches", str(patches))
    assert done.returncode == 2 and "lists patch files of another series" in done.stderr
    assert {path: path.read_bytes() for path in patches.parent.rglob("*") if path.is_file()} == before


@pytest.mark.newest_release
def test_export_of_the_applied_series_reproduces_the_patch_files(
    run_apply, scratch_tree, release_series, release_pin, series_copy
):
    assert run_apply("--vllm-src", str(scratch_tree)).returncode == 0
    patches = series_copy(release_series)
    done = run_apply(
        "--vllm-src", str(scratch_tree), "--export", "--base", release_pin.tag, "--patches", str(patches)
    )
    assert done.returncode == 0, done.stderr
    for patch in release_series.patches:
        assert (patches / patch.name).read_bytes() == patch.path.read_bytes(), patch.name


def test_not_a_vllm_tree_is_refused(run_apply, tmp_path):
    done = run_apply("--vllm-src", str(tmp_path))
    assert done.returncode == 2 and "not a vLLM source tree" in done.stderr


def test_plain_unpacked_tree_is_refused_with_directions(run_apply, scratch_tree, snapshot):
    shutil.rmtree(scratch_tree / ".git")
    done = run_apply("--vllm-src", str(scratch_tree))
    assert done.returncode == 2
    assert "not a git repository" in done.stderr and "git init" in done.stderr
    assert not (scratch_tree / ".git").exists()


@pytest.mark.parametrize(
    ("tree_version", "why"),
    [
        ("0.23.0", "vLLM 0.23.0 has no mtpq series yet"),
        # A checkout built past (or before) a release tag is a development build, not the release.
        ("{release}.dev3+g1234abc", "vLLM {release}.dev3 is a pre-release or development build"),
    ],
    ids=["no-series-yet", "development-build"],
)
def test_unsupported_vllm_version_is_refused_listing_the_supported_ones(
    run_apply, scratch_tree, snapshot, release_pin, tree_version, why
):
    version_file = scratch_tree / "vllm" / "_version.py"
    written = tree_version.format(release=release_pin.version)
    version_file.write_text(version_file.read_text().replace(f"'{release_pin.version}'", f"'{written}'"))
    git(scratch_tree, "commit", "--quiet", "-am", f"pretend {written}")
    before = snapshot(scratch_tree)
    done = run_apply("--vllm-src", str(scratch_tree))
    assert done.returncode == 2
    assert why.format(release=release_pin.version) in done.stderr
    assert f"{release_pin.version} (series {release_pin.series_name})" in done.stderr
    assert "--rebase" in done.stderr and "--export" in done.stderr
    assert snapshot(scratch_tree) == before


def test_missing_git_is_reported(run_apply, scratch_tree, tmp_path):
    done = run_apply("--vllm-src", str(scratch_tree), env={"PATH": str(tmp_path)})  # no git on PATH
    assert done.returncode == 2 and "git is not installed" in done.stderr


@pytest.mark.parametrize("corruption", ["garbage", "missing-entry"])
def test_broken_series_is_refused_before_touching_the_tree(
    run_apply, scratch_tree, snapshot, release_series, series_copy, corruption
):
    patches = series_copy(release_series)
    if corruption == "garbage":
        first = release_series.patches[0].path.relative_to(release_series.directory.parent)
        (patches.parent / first).write_text("this is not a patch\n")
    else:
        (patches / "series").write_text((patches / "series").read_text() + "0099-gone.patch\n")
    before = snapshot(scratch_tree)
    done = run_apply("--vllm-src", str(scratch_tree), "--patches", str(patches))
    assert done.returncode == 2 and "error:" in done.stderr
    assert snapshot(scratch_tree) == before


@pytest.mark.newest_release
def test_the_readme_first_command_works_on_a_fresh_python_without_gitpython(
    pinned_tree, release_pin, release_series, tmp_path
):
    """`python apply.py` as the README gives it, with a bare interpreter (no pip, no GitPython) whose
    cache holds only the release's source tree (what a first run downloads and unpacks)."""
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import git"], capture_output=True).returncode == 1
    cache = tmp_path / "cache"
    tree = cache / "src" / f"vllm-{release_pin.version}"
    git(pinned_tree, "clone", "--quiet", "--branch", release_pin.tag, str(pinned_tree), str(tree))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    # The README's command is for the newest release; a session whose newest is older names it.
    args = [] if release_pin.version == newest_pin(load_pins()).version else ["--vllm", release_pin.version]
    command = [python, "apply.py", *args]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env={**env, "MTPQ_CACHE_DIR": str(cache)}
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert f"({release_series.directory.name}) on vLLM at {tree}" in done.stdout
    assert done.stdout.count("  applied\n") == len(release_series.patches)
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD") == release_pin.branch
