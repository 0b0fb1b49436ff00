"""The rebase matrix (mtpq/apply/matrix.py, benchmarks/rebase_matrix.py) on synthetic vLLM releases served
from a loopback index: what each patch of a series does on each release, and the inputs it refuses."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mtpq.apply import matrix
from mtpq.core import gittree
from mtpq.core.download import DownloadError
from mtpq.core.gittree import MTPQ_IDENT
from mtpq.core.pin import Artifact, Pin, load_pins
from mtpq.core.series import load_series
from tests.conftest import ROOT, git

IDENTITY = {**os.environ, **MTPQ_IDENT}
DEP3 = "Origin: vendor\nForwarded: no\nBug: none\nApplied-Upstream: no\nLast-Update: 2026-01-01\n"
BASE = {name: "".join(f"{name[0]}{n}\n" for n in range(1, 31)) for name in ("a.py", "b.py", "c.py", "d.py")}
# Each patch: its file name and the line edits it makes (numbered lines such as "b25" -> "B25").
PATCHES = {
    "0001-a10.patch": {"a.py": ["a10"]},
    "0002-b5-b25.patch": {"b.py": ["b5", "b25"]},
    "0003-c10.patch": {"c.py": ["c10"]},
    "0004-c20.patch": {"c.py": ["c20"]},
    "0005-b15.patch": {"b.py": ["b15"]},
    "0006-d5-d25.patch": {"d.py": ["d5", "d25"]},
}


def edit(text: str, old: str, new: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(new + "\n" if line == old + "\n" else line for line in lines)


def release_files(**changes: str | None) -> dict[str, str]:
    """BASE with lines changed upstream ({"b25": "b25 upstream"}); a file set to None is gone."""
    files = dict(BASE)
    for line, new in changes.items():
        name = f"{line[0]}.py"
        if new is None:
            del files[name]
        else:
            files[name] = edit(files[name], line, new)
    return files


# The series is made on 1.0.0. 1.1.0 took patch 0001 and rewrote the line 0002's second hunk changes;
# 1.2.0 changed lines within the context of 0003 and 0004 (not the lines they change) and dropped d.py.
RELEASES = {
    "1.0.0": release_files(),
    "1.1.0": release_files(a10="A10", b25="b25 upstream"),
    "1.2.0": release_files(c13="c13 upstream", c23="c23 upstream", d=None),
}


def sdist(version: str, files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in {"__init__.py": "", **files}.items():
            data = text.encode()
            member = tarfile.TarInfo(f"vllm-{version}/vllm/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def make_series(base_tree: Path, directory: Path) -> Path:
    """git format-patch of one commit per PATCHES entry, made on a clone of the base release's tree."""
    work = directory.parent / "series-work"
    git(base_tree, "clone", "--quiet", str(base_tree), str(work))
    for name, edits in PATCHES.items():
        for file, lines in edits.items():
            path = work / "vllm" / file
            for line in lines:
                path.write_text(edit(path.read_text(), line, line.upper()))
        git(work, "commit", "--quiet", "-am", f"{name}\n\n{DEP3}", env=IDENTITY)
    directory.mkdir()
    base = f"HEAD~{len(PATCHES)}"
    made = git(work, "format-patch", "--full-index", "-o", str(directory), base).splitlines()
    for path, name in zip(made, PATCHES, strict=True):
        Path(path).rename(directory / name)
    (directory / "series").write_text("\n".join(PATCHES) + "\n")
    return directory


@pytest.fixture
def releases(index) -> dict[str, Artifact]:
    """Each synthetic release's sdist, served by the loopback index."""
    served = {}
    for version, files in RELEASES.items():
        data = sdist(version, files)
        index.serve("vllm", f"vllm-{version}.tar.gz", data)
        served[version] = Artifact("vllm", f"vllm-{version}.tar.gz", hashlib.sha256(data).hexdigest())
    return served


@pytest.fixture
def trees(releases) -> dict[str, Path]:
    return {version: gittree.sdist_tree(version, artifact) for version, artifact in releases.items()}


@pytest.fixture
def series(trees, tmp_path):
    return load_series(make_series(trees["1.0.0"], tmp_path / "patches"))


def words(result: matrix.SeriesMatrix) -> dict[str, list[str]]:
    return {version: [r.matrix_word() for r in results] for version, results in result.results.items()}


def test_each_patch_is_clean_upstream_3way_or_conflicting_and_a_conflict_does_not_stop_the_rest(
    series, trees
):
    result = matrix.series_matrix(series, trees, made_on={"1.0.0": trees["1.0.0"]})
    assert words(result) == {
        "1.0.0": ["clean"] * 6,
        # 0005 changes b.py too: it is tried on the index as it was before 0002's failed merge
        "1.1.0": ["already upstream", "conflict (1 hunks)", "clean", "clean", "clean", "clean"],
        # 0004's merge needs the blob of c.py after 0003, which only planning on 1.0.0 wrote
        "1.2.0": ["clean", "clean", "3-way", "3-way", "clean", "conflict (2 hunks)"],
    }
    table = matrix.format_matrix(result).splitlines()
    assert table[1].split() == ["patch", "1.0.0", "1.1.0", "1.2.0"]
    assert table[-1].split() == ["clean", "6/6", "4/6", "3/6"]


def test_the_3way_merge_borrows_the_blobs_of_the_release_the_series_was_made_on(series, trees):
    alone = matrix.series_matrix(series, {"1.2.0": trees["1.2.0"]}, made_on={})
    assert words(alone)["1.2.0"][2:4] == ["conflict (1 hunks)", "conflict (1 hunks)"]


def test_a_release_tree_is_planned_at_its_baseline_even_with_the_series_committed_on_head(series, trees):
    """apply.py leaves the pinned tree on mtpq/v<version> with the series committed."""
    base = trees["1.0.0"]
    git(base, "checkout", "--quiet", "-b", "mtpq/v1.0.0")
    git(base, "am", "--quiet", *(str(patch.path) for patch in series.patches), env=IDENTITY)
    result = matrix.series_matrix(series, {"1.0.0": base}, made_on={"1.0.0": base})
    assert words(result)["1.0.0"] == ["clean"] * 6


def test_plan_without_keep_going_still_stops_at_the_first_conflict(series, trees):
    planned = gittree.plan(gittree.open_repo(trees["1.1.0"]), series, "v1.1.0")
    assert [r.status for r in planned][:3] == ["already upstream", "conflict", "not tried"]


def test_the_listing_has_final_sdists_only_oldest_first_and_is_saved_for_offline_runs(index, monkeypatch):
    for version in ("0.9.0", "0.10.0", "0.10.1rc1", "0.8.5.post1"):
        index.serve("vllm", f"vllm-{version}.tar.gz", version.encode())
    index.serve("vllm", "vllm-0.10.0-cp38-abi3-manylinux_2_28_x86_64.whl", b"wheel")
    online = matrix.published_sdists({})
    assert list(online.sdists) == ["0.9.0", "0.10.0"] and not online.saved
    assert online.sdists["0.10.0"].sha256 == hashlib.sha256(b"0.10.0").hexdigest()
    monkeypatch.setenv("MTPQ_INDEX_URL", "http://127.0.0.1:9")  # nothing listens there
    offline = matrix.published_sdists({})
    assert offline.sdists == online.sdists and offline.saved


def test_offline_with_an_empty_cache_is_a_one_line_error(index, monkeypatch):
    monkeypatch.setenv("MTPQ_INDEX_URL", "http://127.0.0.1:9")
    with pytest.raises(DownloadError, match="cannot list vllm on http://127.0.0.1:9") as raised:
        matrix.published_sdists({})
    assert "\n" not in str(raised.value) and "MTPQ_INDEX_URL" in str(raised.value)


def test_a_pinned_release_the_index_publishes_with_another_sha256_is_refused(index):
    index.serve("vllm", "vllm-1.0.0.tar.gz", b"not what was pinned")
    pin = Pin("1.0.0", "gabc", "v1.0.0", {"sdist": Artifact("vllm", "vllm-1.0.0.tar.gz", "0" * 64)})
    with pytest.raises(DownloadError, match="VLLM_VERSIONS pins 0{64}; refusing it"):
        matrix.published_sdists({"1.0.0": pin})
    assert not (index.cache / "index").exists()  # nor saved for offline runs


def test_a_download_that_differs_from_the_published_sha256_is_refused_and_builds_no_tree(index):
    index.serve("vllm", "vllm-1.0.0.tar.gz", sdist("1.0.0", BASE), sha256="1" * 64)
    listing = matrix.published_sdists({})
    with pytest.raises(DownloadError, match="sha256 mismatch for vllm-1.0.0.tar.gz"):
        gittree.sdist_tree("1.0.0", listing.sdists["1.0.0"])
    assert (
        not (index.cache / "src").exists() and not (index.cache / "downloads" / "vllm-1.0.0.tar.gz").exists()
    )


@pytest.mark.parametrize(
    ("spec", "chosen"),
    [
        (None, ["0.9.0", "0.10.0", "0.11.0"]),
        ("0.11.0,0.8.0", ["0.8.0", "0.11.0"]),
        ("..0.9.0", ["0.8.0", "0.9.0"]),
        ("0.9.0..0.10.0,0.8.0", ["0.8.0", "0.9.0", "0.10.0"]),
    ],
)
def test_releases_are_chosen_oldest_first_from_the_series_oldest_pin_by_default(spec, chosen):
    assert matrix.choose_releases(spec, ["0.8.0", "0.9.0", "0.10.0", "0.11.0"], oldest="0.9.0") == chosen


def test_an_unknown_release_is_a_clear_error():
    with pytest.raises(
        matrix.RebaseMatrixError, match=r"vLLM 0.99.0 has no sdist on .* \(the newest there is 0.10.0\)"
    ):
        matrix.choose_releases("0.9.0..0.99.0", ["0.9.0", "0.10.0"], oldest="0.9.0")


def run_script(*args: str) -> subprocess.CompletedProcess:
    """benchmarks/rebase_matrix.py as its docstring says to run it."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.rebase_matrix", *args], cwd=ROOT, capture_output=True, text=True
    )


@pytest.fixture
def pinned_listing(index):
    """The index lists every pinned release with its pinned sha256 (nothing is downloaded here)."""
    for pin in load_pins().values():
        index.serve("vllm", pin.artifacts["sdist"].filename, b"", sha256=pin.artifacts["sdist"].sha256)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--releases", "0.99.0"], "error: vLLM 0.99.0 has no sdist on http://127.0.0.1:"),
        # the list of series that follows is the pin file's, whatever it holds
        (["--series", "v9.9.9"], "error: VLLM_VERSIONS names no series v9.9.9; it names v0.22.1, "),
    ],
)
def test_the_script_refuses_bad_input_in_one_line(pinned_listing, args, message):
    done = run_script(*args)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


def test_the_script_offline_with_an_empty_cache_says_so_in_one_line(index, monkeypatch):
    monkeypatch.setenv("MTPQ_INDEX_URL", "http://127.0.0.1:9")
    done = run_script()
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: cannot list vllm") and done.stderr.count("\n") == 1, done.stderr
