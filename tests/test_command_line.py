"""The command lines as a new user meets them: what they say they are, their versions, and a reader
that stops early (`mtpq doctor DIR --json | head -c 10`): no traceback, the command's own exit code."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mtpq import __version__
from tests.conftest import ROOT
from tests.header_checkpoints import LAYOUTS, compressed_tensors, write_checkpoint

MTPQ = [sys.executable, "-S", "-m", "mtpq"]
APPLY = [sys.executable, str(ROOT / "apply.py")]


def run_into_closed_pipe(command: list[str]) -> subprocess.CompletedProcess:
    """Run `command` with a stdout whose reader has already gone: every write meets EPIPE."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(command, cwd=ROOT, stdout=writer, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(writer)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(works, broken): a BF16 MiMo checkpoint, and one stock vLLM drafts at 0 % acceptance."""
    layout, root = LAYOUTS["mimo"], tmp_path_factory.mktemp("checkpoints")
    works = write_checkpoint(root / "bf16", layout.config, {"model.safetensors": layout.tensors("bf16")})
    config = {**layout.config, "quantization_config": compressed_tensors("int8", [])}
    broken = write_checkpoint(root / "int8", config, {"model.safetensors": layout.tensors("int8")})
    return works, broken


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (lambda works, broken: [*MTPQ, "doctor", works, "--json"], 0),
        (lambda works, broken: [*MTPQ, "doctor", broken, "--json"], 1),
        (lambda works, broken: [*MTPQ, "doctor", broken], 1),
        (lambda works, broken: [*MTPQ, "--help"], 0),
        (lambda works, broken: [*MTPQ, "upstream", "check"], 0),
        (lambda works, broken: [*APPLY, "--image-releases"], 0),
        (lambda works, broken: [*APPLY, "--series-id"], 0),
        (lambda works, broken: [*APPLY, "--help"], 0),
    ],
    ids=[
        "doctor-json",
        "doctor-json-broken",
        "doctor-text",
        "help",
        "upstream-check",
        "apply-list",
        "apply-id",
        "apply-help",
    ],
)
def test_a_reader_that_stops_early_gets_no_traceback_and_the_commands_own_exit_code(
    checkpoints, command, code
):
    done = run_into_closed_pipe([str(part) for part in command(*checkpoints)])
    assert (done.returncode, done.stderr) == (code, "")


def test_mtpq_and_apply_py_say_their_version():
    for command in (MTPQ, APPLY):
        done = subprocess.run([*command, "--version"], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.rstrip().endswith(
            f"{__version__}" + ")" * (command == APPLY)
        )


def test_mtpq_help_says_what_the_tool_is_for():
    done = subprocess.run([*MTPQ, "--help"], cwd=ROOT, capture_output=True, text=True)
    description = " ".join(done.stdout.split("\n\n")[1].split())
    assert description.startswith("mtpq: MTP speculative decoding on quantized checkpoints with vLLM.")
    assert "Command line of" not in done.stdout
