"""The rebase matrix: for each series, how each patch applies to every vLLM release from the series'
oldest pinned release up to the newest on PyPI: clean, 3-way, already upstream or conflict (N hunks).

Run with any Python >= 3.10 (e.g. the test bed's) from the checkout root:
`python -m benchmarks.rebase_matrix`. Trees are built once from the PyPI sdists (sha256-verified
against the index) and reused from the mtpq cache; the matrix goes to stdout, progress and timings to
stderr.
"""

import argparse
import sys
import time
from pathlib import Path

from mtpq.apply import matrix
from mtpq.core import gittree
from mtpq.core.errors import MtpqError
from mtpq.core.pin import PIN_FILE, Artifact, load_pins
from mtpq.core.series import load_series

ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rebase_matrix", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--series", metavar="NAME", help="one series, e.g. v0.22.1 (default: every series)")
    parser.add_argument(
        "--releases",
        metavar="LIST",
        help="comma-separated releases and ranges FIRST..LAST, either end optional, e.g. 0.30.0,0.33.0 "
        "or 0.22.1.. (default: from the series' oldest pinned release to the newest on PyPI)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    try:
        pins = load_pins()
        served = matrix.series_served(pins)
        if args.series and args.series not in served:
            raise matrix.RebaseMatrixError(
                f"{PIN_FILE.name} names no series {args.series}; it names {', '.join(served)}"
            )
        listing = matrix.published_sdists(pins)
        if listing.saved:
            print(
                "note: the index is unreachable; using the release listing saved by an earlier run",
                file=sys.stderr,
            )
        trees: dict[str, Path] = {}

        def tree(version: str, sdist: Artifact) -> Path:
            if version not in trees:
                began = time.perf_counter()
                trees[version] = gittree.sdist_tree(version, sdist)
                print(
                    f"vLLM {version}: {trees[version]} ({time.perf_counter() - began:.1f} s)", file=sys.stderr
                )
            return trees[version]

        for name, series_pins in served.items():
            if args.series not in (None, name):
                continue
            releases = matrix.choose_releases(args.releases, list(listing.sdists), series_pins[0].version)
            series = load_series(series_pins[0].series_dir)
            made_on = {pin.version: tree(pin.version, pin.artifacts["sdist"]) for pin in series_pins}
            columns = {version: tree(version, listing.sdists[version]) for version in releases}
            result = matrix.series_matrix(series, columns, made_on)
            print(matrix.format_matrix(result), end="\n\n", flush=True)
    except MtpqError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(matrix.LEGEND)
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
