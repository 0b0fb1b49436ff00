"""Command line of `python -m mtpq`: doctor, graft and upstream."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mtpq.apply.gittree import TreeError
from mtpq.apply.pin import PinError, load_pins, pin_for
from mtpq.apply.series import SeriesError
from mtpq.checkpoint import facts, report
from mtpq.checkpoint.doctor import diagnose
from mtpq.checkpoint.graft import GraftError, graft
from mtpq.checkpoint.hub import INSTALL_HINT
from mtpq.checkpoint.reader import CheckpointError
from mtpq.checkpoint.survey import SurveyLoadError
from mtpq.upstream import command as upstream_command
from mtpq.upstream import lint, native_tests, pull_requests, vllm_suite

EXIT_BAD_INPUT = 2


def build_parser(prog: str = "mtpq") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
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
    doctor.add_argument("--vllm", metavar="VERSION", help="one pinned vLLM release (default: every one)")
    doctor.add_argument(
        "--platform",
        choices=facts.PLATFORMS,
        default="cuda",
        help="where vLLM runs: some draft MoE schemes have no kernel on some platforms (%(default)s)",
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
            "Write NEW_CKPT: QUANT_CKPT (hard-linked where unchanged) plus the MTP tensors of the BF16 "
            "release (copied tensor by tensor into model_mtp.safetensors), an index mapping every tensor, "
            "and the MTP config fields. Inputs are never modified; NEW_CKPT appears only complete."
        ),
    )
    grafting.add_argument(
        "--mtp-from",
        required=True,
        metavar="BF16_CKPT",
        help="the BF16 release: a local directory, or a Hub repository (ORG/NAME[@REVISION] or its URL) "
        "of which only the MTP tensors' bytes are fetched",
    )
    grafting.add_argument("quantized", type=Path, metavar="QUANT_CKPT")
    grafting.add_argument("--out", type=Path, required=True, metavar="NEW_CKPT")
    grafting.add_argument(
        "--stock-vllm",
        metavar="VERSION",
        help="also add ignore entries under the MTP draft's names in that stock vLLM release, where "
        "that alone makes it work (exit 1 where it cannot; the checkpoint is still written)",
    )
    grafting.add_argument("--force", action="store_true", help="replace NEW_CKPT if it exists")
    upstream_command.add_commands(commands)
    return parser


def main(argv: list[str] | None = None, prog: str = "mtpq") -> int:
    """The `mtpq` console script, and `python -m mtpq`."""
    args = build_parser(prog).parse_args(argv)
    try:
        if args.command == "doctor":
            return _doctor(args)
        if args.command == "upstream":
            return upstream_command.run(args)
        return _graft(args)
    except (
        CheckpointError,
        GraftError,
        SurveyLoadError,
        PinError,
        SeriesError,
        TreeError,
        pull_requests.NotReadyError,
        lint.LintError,
        native_tests.ProofError,
        vllm_suite.SuiteError,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _doctor(args: argparse.Namespace) -> int:
    versions = [pin_for(args.vllm).version] if args.vllm else list(load_pins())
    diagnosis = diagnose(args.checkpoint, versions, args.platform)
    flavour = "patched" if args.with_series else "stock"
    if args.json:
        print(json.dumps(report.as_json(diagnosis, flavour), indent=2))
    else:
        print(report.as_text(diagnosis))
    return report.exit_code(diagnosis, flavour)


def _graft(args: argparse.Namespace) -> int:
    stock_vllm = pin_for(args.stock_vllm).version if args.stock_vllm else None
    result = graft(args.mtp_from, args.quantized, args.out, stock_vllm=stock_vllm, force=args.force)
    for line in result.lines:
        print(line)
    return 0 if result.stock_ok is not False else 1
