"""mtpq: MTP speculative decoding on quantized checkpoints with vLLM. Before renting a GPU, `doctor`
tells whether vLLM (stock, or with the mtpq patch series) serves a checkpoint's MTP layers, from its
config and safetensors headers alone; `graft` gives a quantized checkpoint back the MTP layers its
quantizer dropped; `matrix` prints the supported MTP drafters; `upstream` prepares the series as
vLLM pull requests. apply.py applies the series to vLLM."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mtpq import __version__, output
from mtpq.checkpoint import facts, report
from mtpq.checkpoint.doctor import diagnose
from mtpq.checkpoint.graft import graft
from mtpq.checkpoint.hub import INSTALL_HINT
from mtpq.core import installed
from mtpq.core.errors import MtpqError
from mtpq.core.pin import load_pins, newest_pin, pin_for
from mtpq.core.series import load_series
from mtpq.upstream import drafters, lint, native_tests, pull_requests, release_matrix, vllm_suite

EXIT_BAD_INPUT = 2


def build_parser(prog: str = "mtpq") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser(
        "doctor",
        help="tell a checkpoint's MTP fate on stock vLLM and with the series, from headers only",
        description=(
            "Read a checkpoint's config files and safetensors headers (never tensor data) and tell what "
            "vLLM does with its MTP layers: works, crash, silent 0 % acceptance or MTP silently off, "
            "on stock vLLM and on vLLM with the mtpq series, and the fix. A Hub repository (ORG/NAME"
            "[@REVISION] or its URL) is read through HTTP range requests, before anything is downloaded "
            f"(needs huggingface_hub: {INSTALL_HINT}). Exit code: 0 works, 1 broken, 3 unknown, "
            "2 bad input."
        ),
    )
    doctor.add_argument(
        "checkpoint", help="a local checkpoint directory, a Hub repository ORG/NAME[@REVISION], or its URL"
    )
    doctor.add_argument(
        "--vllm",
        metavar="VERSION",
        help="the pinned vLLM release judged first, whose verdict the exit code is "
        "(default: the one installed here first; the exit code is the worst of every release's)",
    )
    doctor.add_argument(
        "--platform",
        choices=facts.PLATFORMS,
        default="cuda",
        help="where vLLM runs: some draft MoE schemes have no kernel on some platforms; cpu-amx: an x86 CPU "
        "with AMX, which has more (%(default)s)",
    )
    doctor.add_argument(
        "--with-series",
        action="store_true",
        help="exit code by vLLM with the mtpq series (default: by stock vLLM)",
    )
    doctor.add_argument("--json", action="store_true", help="one JSON object instead of text")
    grafting = commands.add_parser(
        "graft",
        help="add a BF16 release's MTP tensors and config fields to a quantized checkpoint",
        description=(
            "Write NEW_CKPT: QUANT_CKPT's files plus the MTP tensors of the BF16 release (copied tensor by "
            "tensor into model_mtp.safetensors), an index mapping every tensor, and the MTP config fields. "
            "QUANT_CKPT's unchanged files are hard-linked, not copied, unless --copy: they share their "
            "data, so editing one in place changes QUANT_CKPT too. Inputs are never modified; NEW_CKPT "
            "appears only complete. The last line says what vLLM still needs to serve its MTP layers. "
            "Exit code: 0 written, 1 written but --stock-vllm's release cannot serve it, 2 bad input "
            "(nothing written)."
        ),
    )
    grafting.add_argument(
        "--mtp-from",
        required=True,
        metavar="BF16_CKPT",
        help="the BF16 release: a local directory, or a Hub repository (ORG/NAME[@REVISION] or its URL) "
        "of which only the MTP tensors' bytes are fetched",
    )
    grafting.add_argument(
        "quantized",
        type=Path,
        metavar="QUANT_CKPT",
        help="the quantized checkpoint directory whose quantizer dropped the MTP layers (read only)",
    )
    grafting.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="NEW_CKPT",
        help="the new checkpoint directory (its missing parents are created; --force replaces one)",
    )
    grafting.add_argument(
        "--stock-vllm",
        metavar="VERSION",
        help="also add ignore entries under the MTP draft's names in that stock vLLM release, where "
        "that alone makes it work (exit 1 where it cannot; the checkpoint is still written)",
    )
    grafting.add_argument("--force", action="store_true", help="replace NEW_CKPT if it exists")
    grafting.add_argument(
        "--copy",
        action="store_true",
        help="copy QUANT_CKPT's unchanged files instead of hard-linking them (uses their disk space again)",
    )
    grafting.add_argument("--json", action="store_true", help="one JSON object instead of text")
    commands.add_parser(
        "matrix",
        help="print the README's MTP drafter support tables (markdown), one per supported release",
        description=(
            "Every MTP drafter of each supported release's registry (read from its tree with the series "
            "applied), how it gets its quantization config, and what the construction probe recorded "
            f"({drafters.RECORD.name}): the draft of a BF16 MTP layer under a quantized target with the "
            "series and on stock vLLM, and what checked it."
        ),
    )
    _add_upstream(commands)
    return parser


def main(argv: list[str] | None = None, prog: str = "mtpq") -> int:
    """The `mtpq` console script, and `python -m mtpq`."""
    with output.closed_pipe_tolerated():
        return _main(build_parser(prog), argv)


def _main(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        if args.command == "doctor":
            return _doctor(args)
        if args.command == "upstream":
            return _upstream(args)
        if args.command == "matrix":
            print(drafters.render_matrix(load_pins(), drafters.load_record()), end="")
            return 0
        return _graft(args)
    except MtpqError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _doctor(args: argparse.Namespace) -> int:
    if args.vllm:
        named = (pin_for(args.vllm).version, report.NAMED_WITH_VLLM)
    else:
        here = installed.release_here()
        named = (here, report.INSTALLED_HERE) if here in load_pins() else None
    diagnosis = diagnose(args.checkpoint, platform=args.platform, named=named)
    flavour = "patched" if args.with_series else "stock"
    if args.json:
        print(json.dumps(report.as_json(diagnosis, flavour), indent=2))
    else:
        print(report.as_text(diagnosis))
    return report.exit_code(diagnosis, flavour)


def _graft(args: argparse.Namespace) -> int:
    stock_vllm = pin_for(args.stock_vllm).version if args.stock_vllm else None
    result = graft(
        args.mtp_from, args.quantized, args.out, stock_vllm=stock_vllm, force=args.force, copy_files=args.copy
    )
    print(json.dumps(result.facts, indent=2) if args.json else "\n".join(result.lines))
    return result.exit_code


def _add_upstream(commands: argparse._SubParsersAction) -> None:
    """`python -m mtpq upstream check|prs|prove|suite|releases|lint`: the series as upstream pull requests."""
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
    releases = actions.add_parser(
        "releases",
        help="the release matrix: print it, or prove the series of an installed vLLM's release (--python)",
        description=release_matrix.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    releases.add_argument(
        "--python", help="interpreter with the vLLM (a CPU test bed) to prove the series on"
    )
    releases.add_argument(
        "--write", action="store_true", help=f"record the release ({release_matrix.RECORD.name})"
    )
    lint = actions.add_parser(
        "lint", parents=[release], help="upstream's ruff, typos and pre-commit hooks on the touched files"
    )
    lint.add_argument(
        "--python", default=sys.executable, help="interpreter for upstream's hooks (regex, PyYAML)"
    )


def _upstream(args: argparse.Namespace) -> int:
    if args.action == "prove":
        installation = installed.find_installation(args.python)
        pin = pin_for(installed.installed_version(installation))
        proofs = native_tests.prove(installation, pin, load_series(pin.series_dir))
        for proof in proofs:
            print(native_tests.describe(proof))
        return 0 if all(proof.ok for proof in proofs) else 1
    if args.action == "releases":
        return _releases(args)
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


def _releases(args: argparse.Namespace) -> int:
    """Prove (and --write) the release of --python's vLLM; without --python print the matrix and what is
    stale in it."""
    pins = load_pins()
    if args.python:
        installation = installed.find_installation(args.python)
        pin = pin_for(installed.installed_version(installation))
        entry = release_matrix.prove_release(installation, pin)
        print(json.dumps({pin.version: entry}, indent=1))
        if args.write:
            release_matrix.save_entry(pin.version, entry)
        return 0
    record = release_matrix.load_record()
    print(release_matrix.render(pins, record), end="")
    stale = release_matrix.stale(pins, record)
    for problem in stale:
        print(f"stale: {problem}")
    return 1 if stale else 0


def _suite(python: str, jobs: int = vllm_suite.JOBS) -> int:
    """vLLM's own suite on `python`'s installed vLLM with the series serving its release."""
    installation = installed.find_installation(python)
    pin = pin_for(installed.installed_version(installation))
    result = vllm_suite.check(installation, pin, load_series(pin.series_dir), jobs)
    print(vllm_suite.describe(result))
    return 1 if result.regressions else 0
