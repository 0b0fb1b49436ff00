"""The rebase matrix: how each patch of a series fares on every vLLM release from the series' own
up to the newest on PyPI (benchmarks/rebase_matrix.py).

The series is planned on each release's sdist tree as `git am` would apply it, patch on patch,
except that a conflicting patch is skipped and the later ones are still tried, so every patch's
fate shows.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mtpq.core import gittree, status
from mtpq.core.download import DownloadError, cache_root, index_url, published_artifacts
from mtpq.core.errors import MtpqError
from mtpq.core.pin import PIN_FILE, Artifact, Pin, release_tag, version_key
from mtpq.core.series import Series
from mtpq.core.status import PatchResult

PROJECT = "vllm"
_FINAL_SDIST = re.compile(r"vllm-(\d+\.\d+\.\d+)\.tar\.gz")  # no pre-, post- or dev releases
LEGEND = """\
clean               applies as it is
3-way               applies only as a 3-way merge with the blobs it was made against
already upstream    the release carries it already
conflict (N hunks)  N of its hunks do not apply: it is skipped, and later patches are tried without it"""


class RebaseMatrixError(MtpqError, ValueError):
    """A release or series the matrix cannot be made for."""


@dataclass(frozen=True)
class Listing:
    sdists: dict[str, Artifact]  # release -> its sdist with the sha256 the index publishes, oldest first
    saved: bool  # the index was unreachable: this is the listing an earlier run saved


def _listing_file() -> Path:
    return cache_root() / "index" / f"{PROJECT}-sdists.json"


def _save_listing(hashes: dict[str, str]) -> None:
    target = _listing_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".part-", delete=False) as part:
        json.dump(hashes, part, indent=1)
    Path(part.name).replace(target)  # whole or not at all, for a run reading it meanwhile


def published_sdists(pins: dict[str, Pin]) -> Listing:
    """Every final vLLM release with an sdist on the index. The listing is saved in the cache so that
    a later run can go on offline with the trees already built. A pinned release whose published
    sha256 is not the one VLLM_VERSIONS pins is refused."""
    try:
        artifacts = published_artifacts(PROJECT)
    except DownloadError as error:
        if not _listing_file().is_file():
            raise DownloadError(
                f"{error}, and no earlier run saved a listing in {_listing_file().parent}. Connect to "
                f"the network or set MTPQ_INDEX_URL to a mirror."
            ) from error
        hashes, saved = json.loads(_listing_file().read_text()), True
    else:
        hashes = {m[1]: a.sha256 for a in artifacts if (m := _FINAL_SDIST.fullmatch(a.filename))}
        saved = False
    for version, pin in pins.items():
        pinned = pin.artifacts["sdist"].sha256
        if version in hashes and hashes[version] != pinned:
            raise DownloadError(
                f"the index publishes sha256 {hashes[version]} for vllm-{version}.tar.gz but "
                f"{PIN_FILE.name} pins {pinned}; refusing it"
            )
    if not saved:
        _save_listing(hashes)
    ordered = sorted(hashes, key=version_key)
    return Listing({v: Artifact(PROJECT, f"vllm-{v}.tar.gz", hashes[v]) for v in ordered}, saved)


def choose_releases(spec: str | None, published: Sequence[str], oldest: str) -> list[str]:
    """The releases `spec` names, oldest first: comma-separated releases and ranges FIRST..LAST (either
    end may be left out). Without a spec: from `oldest` up to the newest published."""

    def known(version: str) -> str:
        if version not in published:
            raise RebaseMatrixError(
                f"vLLM {version} has no sdist on {index_url()}/{PROJECT}/ "
                f"(the newest there is {published[-1]})"
            )
        return version

    chosen: set[str] = set()
    for item in (spec or f"{oldest}..").split(","):
        first, dots, last = item.strip().partition("..")
        if not dots:
            chosen.add(known(first))
            continue
        low = version_key(known(first)) if first else (0,)
        high = version_key(known(last)) if last else version_key(published[-1])
        chosen |= {version for version in published if low <= version_key(version) <= high}
    if not chosen:
        raise RebaseMatrixError(f"--releases {spec} names no release")
    return sorted(chosen, key=version_key)


def series_served(pins: dict[str, Pin]) -> dict[str, list[Pin]]:
    """Each series directory VLLM_VERSIONS names -> the pinned releases it serves, oldest first."""
    served: dict[str, list[Pin]] = {}
    for pin in pins.values():
        served.setdefault(pin.series_name, []).append(pin)
    return served


@dataclass(frozen=True)
class SeriesMatrix:
    series: Series
    results: dict[str, list[PatchResult]]  # release -> one result per patch, oldest release first


def series_matrix(series: Series, trees: dict[str, Path], made_on: dict[str, Path]) -> SeriesMatrix:
    """Plan `series` on the baseline of each release's tree in `trees`, going on past conflicts.

    `made_on` holds the trees of the releases the series serves. They are planned first: that writes
    into their object stores the blobs each patch applies to, which the other trees then borrow for
    their 3-way merges (a tree of another release lacks them).
    """
    lenders = {version: gittree.open_repo(tree) for version, tree in made_on.items()}
    results = {
        version: gittree.plan(repo, series, release_tag(version), keep_going=True)
        for version, repo in lenders.items()
    }
    borrowed = [Path(repo.git_dir) for repo in lenders.values()]
    for version, tree in trees.items():
        if version not in results:
            repo = gittree.open_repo(tree)
            results[version] = gittree.plan(
                repo, series, release_tag(version), keep_going=True, borrow_objects_from=borrowed
            )
    return SeriesMatrix(series, {version: results[version] for version in trees})


def format_matrix(matrix: SeriesMatrix) -> str:
    """One row per patch, one column per release, and a last row counting the clean patches."""
    patches = matrix.series.patches
    releases = list(matrix.results)
    rows = [["patch", *releases]]
    rows += [
        [patch.name, *(matrix.results[version][i].matrix_word() for version in releases)]
        for i, patch in enumerate(patches)
    ]
    clean = [sum(r.status == status.APPLIED for r in matrix.results[version]) for version in releases]
    rows.append(["clean", *(f"{count}/{len(patches)}" for count in clean)])
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    title = f"series {matrix.series.directory.name} ({len(patches)} patches, {matrix.series.series_id})"
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join([title, *lines])
