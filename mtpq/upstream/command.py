"""`python -m mtpq upstream check|prs|prove|suite|lint`: the series as upstream pull requests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mtpq.apply import installed
from mtpq.apply.pin import load_pins, newest_pin, pin_for
from mtpq.apply.series import load_series
from mtpq.upstream import lint, native_tests, pull_requests, vllm_suite


def add_commands(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "upstream",
        help="check the series is ready for upstream, write its pull requests, prove and lint its tests",
        description=pull_requests.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True)
    release = argparse.ArgumentParser(add_help=False)
    release.add_argument(
        "--vllm", metavar="VERSION", help="the release whose series (default: the newest pinned)"
    )
    check = actions.add_parser(
        "check",
        parents=[release],
        help="readiness: title, Bug/Forwarded, PR sections, a test file; with --python, also vLLM's own "
        "tests (suite) on that installed vLLM (exit 1 naming each gap)",
    )
    check.add_argument("--python", help="interpreter with the vLLM (a CPU test bed) to run the suite on")
    prs = actions.add_parser(
        "prs", parents=[release], help="write one directory per patch: the patch, title.txt, body.md"
    )
    prs.add_argument("out", type=Path, help="a new directory")
    prove = actions.add_parser(
        "prove",
        help="run each patch's vLLM-native tests without and with it on --python's installed vLLM "
        "(exit 1 if one passes without its patch or fails with it)",
    )
    prove.add_argument("--python", default=sys.executable, help="interpreter with the vLLM to test on")
    suite = actions.add_parser(
        "suite",
        help="vLLM's own tests of the areas the series touches, on --python's installed vLLM with the "
        "series: exit 1 listing every test that passes on stock and fails patched",
    )
    suite.add_argument("--python", default=sys.executable, help="interpreter with the vLLM to test on")
    suite.add_argument(
        "--record", action="store_true", help="run them on stock instead and record which pass"
    )
    suite.add_argument(
        "--jobs",
        type=int,
        default=vllm_suite.JOBS,
        help=f"pytest processes at once (default {vllm_suite.JOBS})",
    )
    lint = actions.add_parser(
        "lint", parents=[release], help="upstream's ruff, typos and pre-commit hooks on the touched files"
    )
    lint.add_argument(
        "--python", default=sys.executable, help="interpreter for upstream's hooks (regex, PyYAML)"
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "prove":
        installation = installed.find_installation(args.python)
        pin = pin_for(installed.installed_version(installation))
        proofs = native_tests.prove(installation, pin, load_series(pin.series_dir))
        for proof in proofs:
            print(native_tests.describe(proof))
        return 0 if all(proof.ok for proof in proofs) else 1
    if args.action == "suite":
        if args.record:
            installation = installed.find_installation(args.python)
            pin = pin_for(installed.installed_version(installation))
            data = vllm_suite.record(installation, pin, load_series(pin.series_dir), args.jobs)
            print(f"{vllm_suite.record_path(pin)}: {data['outcomes']}, {len(data['passed'])} recorded")
            return 0
        return _suite(args.python, args.jobs)
    pins = load_pins()
    pin = pin_for(args.vllm, pins) if args.vllm else newest_pin(pins)
    series = load_series(pin.series_dir)
    if args.action == "check":
        findings = pull_requests.check_ready(series)
        for finding in findings:
            print(finding)
        ready = len(pull_requests.proposed(series))
        print(f"{series.directory.name}: {'not ready' if findings else 'ready'} ({ready} pull request(s))")
        suite_ok = _suite(args.python) == 0 if args.python else True
        return 0 if not findings and suite_ok else 1
    if args.action == "prs":
        for directory in pull_requests.write_pull_requests(series, args.out):
            print(directory)
        return 0
    results = lint.lint(pin, series, args.python)
    for result in results:
        print(f"{'ok  ' if result.ok else 'FAIL'} {result.hook}")
        if not result.ok and result.output:
            print("     " + result.output.replace("\n", "\n     "))
    return 0 if all(result.ok for result in results) else 1


def _suite(python: str, jobs: int = vllm_suite.JOBS) -> int:
    """vLLM's own suite on `python`'s installed vLLM with the series serving its release."""
    installation = installed.find_installation(python)
    pin = pin_for(installed.installed_version(installation))
    result = vllm_suite.check(installation, pin, load_series(pin.series_dir), jobs)
    print(vllm_suite.describe(result))
    return 1 if result.regressions else 0
