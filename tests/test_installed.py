"""apply.py --installed: patch a vLLM in an environment's site-packages and undo it."""

from __future__ import annotations

import shutil

import pytest

from mtpq.core import installed
from mtpq.core.installed import STATE_DIR_NAME
from tests.faults import Environment, fingerprint


@pytest.fixture
def environment(tmp_path, pinned_tree, release_pin, release_series) -> Environment:
    return Environment(tmp_path / "env", pinned_tree, release_pin, release_series)


def test_an_environment_that_already_carries_the_series_is_recognised(run_apply, environment, release_series):
    """As `pip install` of the mtpq wheel leaves it: the patched files and no mtpq state beside them."""
    assert run_apply("--installed", "--python", environment.python).returncode == 0
    shutil.rmtree(environment.site / STATE_DIR_NAME)
    patched = fingerprint(environment.site)
    done = run_apply("--installed", "--python", environment.python)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("  already upstream\n") == len(release_series.patches)
    after = fingerprint(environment.site)
    assert {path: after[path] for path in patched} == patched
    assert run_apply("--installed", "--python", environment.python, "--verify").returncode == 0


def test_apply_is_idempotent_and_revert_restores_every_byte(run_apply, environment, release_series):
    pristine = fingerprint(environment.site)
    first = run_apply("--installed", "--python", environment.python)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("  applied\n") == len(release_series.patches)
    patched = fingerprint(environment.site)
    changed = {
        path
        for path in pristine.keys() | patched.keys()
        if pristine.get(path) != patched.get(path) and not path.startswith(STATE_DIR_NAME)
    }
    assert changed == set(installed.package_files(release_series))

    second = run_apply("--installed", "--python", environment.python)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("  already applied\n") == len(release_series.patches)
    assert fingerprint(environment.site) == patched

    verified = run_apply("--installed", "--python", environment.python, "--verify")
    assert verified.returncode == 0, verified.stdout

    reverted = run_apply("--installed", "--python", environment.python, "--revert")
    assert reverted.returncode == 0, reverted.stderr
    assert fingerprint(environment.site) == pristine
    assert not (environment.site / STATE_DIR_NAME).exists()


def test_verify_fails_on_an_unpatched_environment(run_apply, environment):
    done = run_apply("--installed", "--python", environment.python, "--verify")
    assert done.returncode == 1 and "missing" in done.stdout


def test_check_changes_nothing(run_apply, environment, release_series):
    pristine = fingerprint(environment.site)
    done = run_apply("--installed", "--python", environment.python, "--check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("  would apply\n") == len(release_series.patches)
    assert "  applied\n" not in done.stdout and "(--check: nothing was changed)" in done.stdout
    assert fingerprint(environment.site) == pristine


def test_a_patch_that_does_not_apply_leaves_site_packages_untouched(run_apply, environment, release_series):
    target = environment.site / installed.package_files(release_series)[-1]
    target.write_text("# someone rewrote this file\n")
    before = fingerprint(environment.site)
    done = run_apply("--installed", "--python", environment.python)
    assert done.returncode == 1 and "conflict: " in done.stdout
    assert fingerprint(environment.site) == before


@pytest.mark.parametrize(
    ("installed_version", "why"),
    [
        ("0.23.0", "vLLM 0.23.0 has no mtpq series yet"),
        # A development build of a pinned release is not that release: its files may differ.
        ("{release}.dev3+g1234abc", "vLLM {release}.dev3 is a pre-release or development build"),
        ("0.99.0", "vLLM 0.99.0 is outside the releases mtpq carries"),
    ],
    ids=["no-series-yet", "development-build", "outside-the-range"],
)
def test_unsupported_installed_version_is_refused(
    run_apply, environment, release_pin, installed_version, why
):
    version_file = environment.site / "vllm" / "_version.py"
    written = installed_version.format(release=release_pin.version)
    version_file.write_text(version_file.read_text().replace(f"'{release_pin.version}'", f"'{written}'"))
    before = fingerprint(environment.site)
    done = run_apply("--installed", "--python", environment.python)
    assert done.returncode == 2 and why.format(release=release_pin.version) in done.stderr
    assert release_pin.version in done.stderr
    assert fingerprint(environment.site) == before


def test_environment_without_vllm_is_refused(run_apply, environment):
    shutil.rmtree(environment.site / "vllm")
    done = run_apply("--installed", "--python", environment.python)
    assert done.returncode == 2 and "no vLLM is installed" in done.stderr


def test_revert_refuses_files_changed_after_patching(run_apply, environment, release_series):
    assert run_apply("--installed", "--python", environment.python).returncode == 0
    first = installed.package_files(release_series)[0]
    edited = environment.site / first
    edited.write_text(edited.read_text() + "# local edit\n")
    before = fingerprint(environment.site)
    done = run_apply("--installed", "--python", environment.python, "--revert")
    assert done.returncode == 2 and first in done.stderr
    assert fingerprint(environment.site) == before
