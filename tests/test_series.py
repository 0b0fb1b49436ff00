"""Series hygiene: the patch files, the series file, and how they apply to the pinned tree."""

from __future__ import annotations

import subprocess

import pytest

from mtpq.core.series import DEP3_REQUIRED, SeriesError, load_series


def test_every_patch_file_is_listed_once_and_parses(release_series):
    on_disk = sorted(path.name for path in release_series.directory.glob("*.patch"))
    shared = {patch.name for patch in release_series.shared_patches}
    assert sorted(patch.name for patch in release_series.patches if patch.name not in shared) == on_disk
    assert release_series.patches, "the series is empty"


@pytest.mark.parametrize("field", DEP3_REQUIRED)
def test_every_patch_carries_dep3_field(release_series, field):
    assert all(patch.dep3.get(field) for patch in release_series.patches)


def test_every_patch_ends_with_newline_and_has_an_author(release_series):
    for patch in release_series.patches:
        assert patch.path.read_bytes().endswith(b"\n"), patch.name
        assert "<" in patch.author, patch.name


def test_each_patch_applies_without_fuzz_to_its_release(release_series, pinned_tree, release_pin, tmp_path):
    """GNU patch with --fuzz=0, in series order, on a pristine export of the baseline. A patch shared
    with the series of a newer release may shift lines (an offset); the others not even that."""
    archive = tmp_path / "baseline.tar"
    subprocess.run(
        ["git", "-C", str(pinned_tree), "archive", "-o", str(archive), release_pin.tag], check=True
    )
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(tree)], check=True)
    for patch in release_series.patches:
        done = subprocess.run(
            ["patch", "-p1", "--fuzz=0", "--forward", "--batch", "-i", str(patch.path)],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "fuzz" not in done.stdout, done.stdout
        if patch.path.parent == release_series.directory:
            assert "offset" not in done.stdout, done.stdout


@pytest.fixture
def own_series(series, series_copy):
    """A private copy of the target's series directory."""
    return series_copy(series)


def _first_patch(directory):
    return sorted(directory.glob("*.patch"))[0]


def test_unlisted_patch_file_is_reported(own_series):
    (own_series / "9999-stray.patch").write_text(_first_patch(own_series).read_text())
    with pytest.raises(SeriesError, match="not listed in series: 9999-stray.patch"):
        load_series(own_series)


def test_series_entry_without_file_is_reported(own_series):
    with (own_series / "series").open("a") as listing:
        listing.write("0099-missing.patch\n")
    with pytest.raises(SeriesError, match="entries without a file: 0099-missing.patch"):
        load_series(own_series)


def test_duplicate_series_entry_is_reported(own_series):
    with (own_series / "series").open("a") as listing:
        listing.write(_first_patch(own_series).name + "\n")
    with pytest.raises(SeriesError, match="listed more than once"):
        load_series(own_series)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda text: text.split("\ndiff --git ")[0] + "\n", "no 'diff --git' section"),
        (lambda text: text.replace("\nForwarded:", "\nX-Forwarded:"), "DEP-3 field.*Forwarded"),
        (lambda text: text.rstrip("\n"), "no newline at end of file"),
        (lambda text: text.replace("\nSubject:", "\nX-Subject:"), "missing From:/Subject:"),
    ],
    ids=["no-diff", "no-forwarded", "no-final-newline", "no-subject"],
)
def test_damaged_patch_is_reported(own_series, damage, message):
    patch = _first_patch(own_series)
    patch.write_text(damage(patch.read_text()))
    with pytest.raises(SeriesError, match=message):
        load_series(own_series)


def test_a_folded_author_header_is_one_line(own_series):
    """git format-patch folds a long From: over two lines; `git am` reads it as one."""
    patch = _first_patch(own_series)
    folded = "From: A contributor whose name is long\n <contributor@example.org>"
    patch.write_text(patch.read_text().replace("From: mtpq developers <dev@mtpq.invalid>", folded, 1))
    (parsed,) = [entry for entry in load_series(own_series).patches if entry.path == patch]
    assert parsed.author == "A contributor whose name is long <contributor@example.org>"


def test_series_id_flag_prints_the_id_alone(run_apply, series, pin):
    done = run_apply("--series-id", "--vllm", pin.version)
    assert (done.returncode, done.stdout) == (0, f"{series.series_id}\n"), done.stderr


def test_series_id_follows_the_patch_contents(run_apply, series, own_series, pin):
    patch = _first_patch(own_series)
    patch.write_text(patch.read_text() + "\n")
    done = run_apply("--series-id", "--vllm", pin.version, "--patches", str(own_series))
    assert done.returncode == 0 and done.stdout.strip() not in ("", series.series_id), done.stderr


def test_series_id_of_a_broken_series_is_refused(run_apply, own_series):
    (own_series / "series").write_text(2 * (_first_patch(own_series).name + "\n"))
    done = run_apply("--series-id", "--patches", str(own_series))
    assert (done.returncode, done.stdout) == (2, "") and "listed more than once" in done.stderr
