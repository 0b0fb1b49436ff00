"""apply.py --installed: patch a vLLM in an environment's site-packages and undo it."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpq.installed import STATE_DIR_NAME


class Environment:
    """A bare virtualenv whose site-packages holds the pinned tree's vllm files the series touches."""

    def __init__(self, root: Path, baseline_file, release_series) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
        self.python = str(root / "bin" / "python")
        self.site = Path(
            subprocess.run(
                [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        for relative in ("vllm/__init__.py", "vllm/_version.py", *release_series.files):
            if (content := baseline_file(relative)) is not None:  # None: a file the series creates
                (self.site / relative).parent.mkdir(parents=True, exist_ok=True)
                (self.site / relative).write_bytes(content)

    def fingerprint(self) -> dict[str, str]:
        """sha256 of every file under site-packages (the state directory included)."""
        return {
            str(path.relative_to(self.site)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(self.site.rglob("*"))
            if path.is_file()
        }


@pytest.fixture
def environment(tmp_path, pinned_tree, release_pin, release_series) -> Environment:
    def baseline_file(relative: str) -> bytes | None:
        # From the baseline tag: the pinned tree's working copy may be on the series branch.
        show = ["git", "-C", str(pinned_tree), "show", f"{release_pin.tag}:{relative}"]
        done = subprocess.run(show, capture_output=True)
        return done.stdout if done.returncode == 0 else None

    return Environment(tmp_path / "env", baseline_file, release_series)


def test_an_environment_that_already_carries_the_series_is_recognised(run_apply, environment, release_series):
    """As `pip install` of the mtpq wheel leaves it: the patched files and no mtpq state beside them."""
    assert run_apply("--installed", "--python", environment.python).returncode == 0
    shutil.rmtree(environment.site / STATE_DIR_NAME)
    patched = environment.fingerprint()
    done = run_apply("--installed", "--python", environment.python)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("  already upstream\n") == len(release_series.patches)
    after = environment.fingerprint()
    assert {path: after[path] for path in patched} == patched
    assert run_apply("--installed", "--python", environment.python, "--verify").returncode == 0


def test_apply_is_idempotent_and_revert_restores_every_byte(run_apply, environment, release_series):
    pristine = environment.fingerprint()
    first = run_apply("--installed", "--python", environment.python)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("  applied\n") == len(release_series.patches)
    patched = environment.fingerprint()
    changed = {
        path
        for path in pristine.keys() | patched.keys()
        if pristine.get(path) != patched.get(path) and not path.startswith(STATE_DIR_NAME)
    }
    assert changed == {path for path in release_series.files if path.startswith("vllm/")}

    second = run_apply("--installed", "--python", environment.python)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("  already applied\n") == len(release_series.patches)
    assert environment.fingerprint() == patched

    verified = run_apply("--installed", "--python", environment.python, "--verify")
    assert verified.returncode == 0, verified.stdout

    reverted = run_apply("--installed", "--python", environment.python, "--revert")
    assert reverted.returncode == 0, reverted.stderr
    assert environment.fingerprint() == pristine
    assert not (environment.site / STATE_DIR_NAME).exists()


def test_verify_fails_on_an_unpatched_environment(run_apply, environment):
    done = run_apply("--installed", "--python", environment.python, "--verify")
    assert done.returncode == 1 and "missing" in done.stdout


def test_check_changes_nothing(run_apply, environment, release_series):
    pristine = environment.fingerprint()
    done = run_apply("--installed", "--python", environment.python, "--check")
    assert done.returncode == 0, done.stderr
    assert environment.fingerprint() == pristine


def test_a_patch_that_does_not_apply_leaves_site_packages_untouched(run_apply, environment, release_series):
    target = environment.site / release_series.files[-1]
    target.write_text("# someone rewrote this file\n")
    before = environment.fingerprint()
    done = run_apply("--installed", "--python", environment.python)
    assert done.returncode == 1 and "conflict: " in done.stdout
    assert environment.fingerprint() == before


def test_unsupported_installed_version_is_refused(run_apply, environment, release_pin):
    version_file = environment.site / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace(f"'{release_pin.version}'", "'0.23.0'"))
    before = environment.fingerprint()
    done = run_apply("--installed", "--python", environment.python)
    assert done.returncode == 2 and "vLLM 0.23.0 has no mtpq series" in done.stderr
    assert release_pin.version in done.stderr
    assert environment.fingerprint() == before


def test_environment_without_vllm_is_refused(run_apply, environment):
    shutil.rmtree(environment.site / "vllm")
    done = run_apply("--installed", "--python", environment.python)
    assert done.returncode == 2 and "no vLLM is installed" in done.stderr


def test_revert_refuses_files_changed_after_patching(run_apply, environment, release_series):
    assert run_apply("--installed", "--python", environment.python).returncode == 0
    edited = environment.site / release_series.files[0]
    edited.write_text(edited.read_text() + "# local edit\n")
    before = environment.fingerprint()
    done = run_apply("--installed", "--python", environment.python, "--revert")
    assert done.returncode == 2 and release_series.files[0] in done.stderr
    assert environment.fingerprint() == before
