"""The header survey (vllm/transformers_utils/mtp_checkpoint.py) on hostile inputs: the time and peak
memory of each worst case, and a longer property run than CI's.

    <test bed>/bin/python -m benchmarks.survey_fuzz bounds
    <test bed>/bin/python -m benchmarks.survey_fuzz properties [--scale 10]

Run with a test bed's interpreter (its vLLM patched: `python tests/run.py --venv`). `bounds` runs each
case in a fresh process and prints its outcome, wall time and peak RSS above the interpreter's own.
`properties` runs tests/test_mtp_checkpoint_properties.py's inputs `--scale` times over from a random
seed (CI's inputs are fixed), and prints the number of inputs and the time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20


def _header_file(path: Path, header: bytes) -> None:
    with path.open("wb") as stream:
        stream.write(len(header).to_bytes(8, "little"))
        stream.write(header)


def _valid_entries(count: int) -> bytes:
    """A valid header of `count` tensors, as safetensors writes it (an MTP model's many experts)."""
    parts = [
        f'"model.layers.{i // 4096}.mlp.experts.{i % 4096}.w{i % 3}.weight":'
        f'{{"dtype":"BF16","shape":[8,8],"data_offsets":[0,0]}}'
        for i in range(count)
    ]
    return ("{" + ",".join(parts) + "}").encode()


def _make(case: str, directory: Path) -> Path:
    """The input for `case`; returns the path the survey is given (a file or a checkpoint)."""
    shard = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if case == "63MiB header of [{},{},...]":
        body = b'{"a":[' + b"{}," * ((63 * MIB) // 3 - 4) + b"{}]}"
        _header_file(shard, body)
        return shard
    if case == "63MiB header of nested arrays":
        depth = 63 * MIB // 2 - 8
        _header_file(shard, b'{"a":' + b"[" * depth + b"]" * depth + b"}")
        return shard
    if case.startswith("valid header, "):
        count = int(case.split()[2].replace(",", ""))
        _header_file(shard, _valid_entries(count))
        return shard
    if case == "header length 2**62":
        shard.write_bytes((2**62).to_bytes(8, "little") + b"{}")
        return shard
    _header_file(shard, b'{"mtp.0.fc.weight":{"dtype":"BF16","shape":[2],"data_offsets":[0,0]}}')
    if case == "index: 600 MiB":
        with index.open("wb") as stream:
            stream.write(b'{"weight_map":{' + b" " * (600 * MIB) + b"}}")
    elif case == "index: symlink to /dev/zero":
        index.symlink_to("/dev/zero")
    elif case == "index: a FIFO":
        os.mkfifo(index)
    elif case == "index: weight_map nested 100,000 deep":
        index.write_text('{"weight_map":' + "{" * 100_000 + "}" * 100_000 + "}")
    elif case == "index: 63 MiB weight_map of MTP tensors":
        count = 63 * MIB // 40
        members = ",".join(f'"mtp.{i}.fc.weight":"model.safetensors"' for i in range(count))
        index.write_text('{"weight_map":{' + members[: 63 * MIB].rsplit(",", 1)[0] + "}}")
    elif case == "index: a 4,301-digit layer number":
        index.write_text(
            json.dumps({"weight_map": {"model.layers." + "9" * 4301 + ".x": "model.safetensors"}})
        )
    elif case == "index: a 300-byte file name":
        index.write_text(json.dumps({"weight_map": {"mtp.0.fc.weight": "x" * 300}}))
    elif case == "index: a NUL in a file name":
        index.write_text(json.dumps({"weight_map": {"mtp.0.fc.weight": "a\0b"}}))
    else:
        raise ValueError(case)
    return directory


CASES = [
    "header length 2**62",
    "63MiB header of [{},{},...]",
    "63MiB header of nested arrays",
    "valid header, 100,000 tensors",
    "valid header, 595,000 tensors",
    "index: 600 MiB",
    "index: symlink to /dev/zero",
    "index: a FIFO",
    "index: weight_map nested 100,000 deep",
    "index: 63 MiB weight_map of MTP tensors",
    "index: a 4,301-digit layer number",
    "index: a 300-byte file name",
    "index: a NUL in a file name",
]

_CHILD = """
import json, sys, time
from pathlib import Path
from vllm.transformers_utils import mtp_checkpoint as m
from tests.survey_cases import read_header
def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1])  # KiB
# The peak is reset (ru_maxrss would carry the parent's over exec).
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")
base = status("VmRSS")
path = Path(sys.argv[1])
start = time.perf_counter()
try:
    if path.is_dir():
        result = m.survey_mtp_checkpoint(path, 4, 1)
        outcome = "survey: " + str(getattr(result, "summary", result))[:80]
    else:
        outcome = f"header of {len(read_header(path)):,} tensors"
except (m.CheckpointHeaderError, m.MtpTensorsMissingError) as error:
    outcome = f"{type(error).__name__}: {str(error).replace(str(path), '<input>')[:110]}"
seconds = time.perf_counter() - start
peak = status("VmHWM")
print(json.dumps({"outcome": outcome, "seconds": seconds, "rss_mib": (peak - base) / 1024}))
"""


def bounds() -> int:
    print(f"{'case':42} {'time':>7} {'RSS+':>9}  outcome")
    worst = 0
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="survey-bounds-") as scratch:
            target = _make(case, Path(scratch))
            try:
                done = subprocess.run(
                    [sys.executable, "-c", _CHILD, str(target)],
                    cwd=ROOT,  # where the child imports tests.survey_cases from
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            except subprocess.TimeoutExpired:
                print(f"{case:42}  TIMEOUT (over 120 s)")
                worst = 1
                continue
        if done.returncode != 0:
            print(f"{case:42}  CRASHED: {done.stderr.strip().splitlines()[-1:]}")
            worst = 1
            continue
        found = json.loads(done.stdout)
        print(f"{case:42} {found['seconds']:6.2f}s {found['rss_mib']:6.0f}MiB  {found['outcome']}")
    return worst


def properties(scale: int) -> int:
    env = {**os.environ, "MTPQ_SURVEY_SCALE": str(scale)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
         str(ROOT / "tests" / "test_mtp_checkpoint_properties.py")],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    passing = sum(int(count) for count in re.findall(r"- (\d+) passing", done.stdout))
    print(done.stdout[-3000:] if done.returncode else done.stdout.splitlines()[-1])
    print(f"{passing:,} passing inputs in {seconds:.0f} s (scale {scale}, rc {done.returncode})")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of the pytest process: {peak:.0f} MiB")
    return done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["bounds", "properties"])
    parser.add_argument("--scale", type=int, default=10)
    args = parser.parse_args()
    return bounds() if args.what == "bounds" else properties(args.scale)


if __name__ == "__main__":
    sys.exit(main())
