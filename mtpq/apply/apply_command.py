"""Command line of apply.py."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mtpq import __version__, output
from mtpq.apply.wheel import build_wheel, local_version
from mtpq.core import gittree, installed, status
from mtpq.core.download import sweep_scratch
from mtpq.core.errors import MtpqError
from mtpq.core.pin import Pin, image_releases, load_pins, newest_pin, pin_for
from mtpq.core.series import Series, load_series

EXIT_CONFLICT = 1
EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apply.py",
        description=(
            "Apply the mtpq patch series to vLLM. The series is the one VLLM_VERSIONS names for the "
            "vLLM release found (tree, installation) or given (--vllm). With no source: download that "
            "release's sdist (sha256-verified, cached), make it a git tree and apply the series there."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s (mtpq {__version__})")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--vllm-src", type=Path, metavar="DIR", help="a clean vLLM git checkout to apply onto")
    where.add_argument(
        "--installed", action="store_true", help="patch the vLLM installed in --python's environment"
    )
    where.add_argument("--wheel", action="store_true", help="build a patched wheel from the official one")
    parser.add_argument("--arch", help="with --wheel: x86_64 or aarch64")
    parser.add_argument(
        "--vllm",
        metavar="VERSION",
        help="the release for the default tree, --wheel and --series-id (default: the newest pinned)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("dist"), help="with --wheel: output directory (%(default)s)"
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter whose vLLM --installed patches")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="dry run: print the table, change nothing")
    action.add_argument(
        "--verify", action="store_true", help="with --installed: succeed only if the series is in place"
    )
    action.add_argument("--revert", action="store_true", help="with --installed: restore the original files")
    action.add_argument(
        "--export", action="store_true", help="regenerate patches/ from the commits on --vllm-src"
    )
    action.add_argument(
        "--series-id", action="store_true", help="print the series id (it names wheels and images) and exit"
    )
    action.add_argument(
        "--release-info",
        action="store_true",
        help="print the release's version, series, series id, sm121 image inputs and the file name of its "
        "patched aarch64 wheel as KEY=VALUE lines",
    )
    action.add_argument(
        "--image-releases",
        action="store_true",
        help="print the releases images are built for (the newest each series serves), one a line",
    )
    parser.add_argument("--branch", help="branch for the series (default mtpq/v<version>)")
    parser.add_argument(
        "--rebase",
        action="store_true",
        help="allow another vLLM version and stop mid-`git am` on a conflict, for resolving",
    )
    parser.add_argument(
        "--base", help="with --export: the upstream commit the series sits on (default: nearest tag)"
    )
    parser.add_argument(
        "--patches",
        type=Path,
        help="the series directory (default: the one VLLM_VERSIONS names for the release)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    with output.closed_pipe_tolerated():
        return _main(build_parser(), argv)


def _main(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    args = parser.parse_args(argv)
    if (args.verify or args.revert) and not args.installed:
        parser.error("--verify and --revert need --installed")
    if args.export and not args.vllm_src:
        parser.error("--export needs --vllm-src (the branch holding the resolved series)")
    if args.wheel and not args.arch:
        parser.error("--wheel needs --arch (x86_64 or aarch64)")
    if args.vllm and (args.vllm_src or args.installed):
        parser.error(
            "--vllm names the release for the default tree, --wheel, --series-id or --release-info; "
            "with --vllm-src or --installed the release is the one found there"
        )
    if args.release_info and args.vllm_src:
        parser.error("--release-info describes a pinned release (--vllm) or the installed one (--installed)")
    if args.image_releases and (args.vllm or args.vllm_src or args.installed or args.wheel):
        parser.error("--image-releases lists releases: no --vllm, --vllm-src, --installed or --wheel")
    try:
        sweep_scratch()
        return _run(args)
    # ValueError besides: what the standard library raises on malformed input (bad JSON, undecodable text).
    except (MtpqError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _series(args: argparse.Namespace, pin: Pin) -> Series:
    return load_series(args.patches or pin.series_dir)


def _release_info(pin: Pin, series: Series) -> str:
    """KEY=VALUE lines for scripts (docker/build.sh, docker/Dockerfile)."""
    info = {
        "version": pin.version,
        "series": series.directory.name,
        "series_id": series.series_id,
        "aarch64_wheel": pin.wheel_name("aarch64", local_version(pin, series)),  # what --wheel writes
    }
    return "\n".join(f"{key}={value}" for key, value in {**info, **pin.sm121}.items())


def _run(args: argparse.Namespace) -> int:
    pins = load_pins()
    if args.image_releases:
        print("\n".join(pin.version for pin in image_releases(pins)))
        return 0
    if args.installed:
        return _run_installed(args, pins)
    if args.vllm_src is not None:
        return _run_tree(args, pins)
    pin = pin_for(args.vllm, pins) if args.vllm else newest_pin(pins)
    series = _series(args, pin)
    if args.series_id or args.release_info:
        print(_release_info(pin, series) if args.release_info else series.series_id)
        return 0
    if args.wheel:
        start = time.perf_counter()
        built = build_wheel(pin, series, args.arch, args.out)
        print(f"built in {time.perf_counter() - start:.1f} s, series {series.series_id}")
        print(built)
        return 0
    tree = gittree.pinned_tree(pin)
    repo = gittree.open_repo(tree)
    # The managed tree is rebuilt on every run: the series branch restarts from the baseline tag.
    return _apply_to(args, repo, tree, series, args.branch or pin.branch, base=pin.tag, replace_branch=True)


def _run_tree(args: argparse.Namespace, pins: dict[str, Pin]) -> int:
    """--vllm-src: the series of the release the checkout is; another release only with --rebase."""
    tree = args.vllm_src
    repo = gittree.open_repo(tree)
    found = gittree.tree_version(repo)
    if found in pins:
        pin = pins[found]
    elif args.rebase or (args.export and args.patches):
        pin = newest_pin(pins)  # the series to carry (or --patches); the branch names the tree's release
    else:
        pin_for(found, pins)  # raises: the supported releases and the way to carry a series
    series = _series(args, pin)
    if args.series_id:
        print(series.series_id)
        return 0
    if args.export:
        exported = gittree.export_series(repo, args.base, series.directory)
        count = len(exported.patches)
        print(f"exported {count} patch(es) to {exported.directory} (series {exported.series_id})")
        return 0
    return _apply_to(args, repo, tree, series, args.branch or f"mtpq/v{found}")


def _apply_to(
    args: argparse.Namespace,
    repo: gittree.Repo,
    tree: Path,
    series: Series,
    branch: str,
    base: str = "HEAD",
    replace_branch: bool = False,
) -> int:
    if args.check:
        results = gittree.check_series(repo, series, base)
    else:
        results = gittree.apply_series(
            repo, series, branch, base, replace_branch=replace_branch, keep_conflict=args.rebase
        )
    title = f"mtpq series {series.series_id} ({series.directory.name}) on vLLM at {tree}" + (
        "" if args.check else f" (branch {branch})"
    )
    print(status.format_table(title, results, dry_run=args.check))
    if status.all_ok(results):
        print(tree)
        return 0
    _explain_conflict(tree, args.rebase)
    return EXIT_CONFLICT


def _explain_conflict(tree: Path, kept: bool) -> None:
    if kept:
        print(
            f"Stopped mid-`git am` in {tree}: resolve the files, `git add` them, `git am --continue`, "
            f"then `python apply.py --vllm-src {tree} --export` to rewrite patches/.",
            file=sys.stderr,
        )
    else:
        print(
            f"Nothing was changed in {tree}. To resolve: re-run with --rebase to stop at the "
            f"conflict on the series branch, fix it, `git am --continue`, then --export.",
            file=sys.stderr,
        )


def _run_installed(args: argparse.Namespace, pins: dict[str, Pin]) -> int:
    installation = installed.find_installation(args.python)
    pin = pin_for(installed.installed_version(installation), pins)
    if args.revert:
        restored = installed.revert_installed(installation)
        print(
            f"restored {len(restored)} file(s) in {installation.package_dir}"
            if restored
            else "nothing to revert"
        )
        return 0
    series = _series(args, pin)
    if args.series_id or args.release_info:
        print(_release_info(pin, series) if args.release_info else series.series_id)
        return 0
    if args.verify:
        results = installed.verify_installed(installation, series)
    else:
        results = installed.apply_installed(installation, series, dry_run=args.check)
    title = f"mtpq series {series.series_id} ({series.directory.name}) in {installation.package_dir}"
    print(status.format_table(title, results, dry_run=args.check))
    return 0 if status.all_ok(results) else EXIT_CONFLICT
