"""Kill apply.py at every file-system step of every mode that writes, and check after each that
nothing is lost and the next ordinary run finishes the job (tests/faults.py); then runs two at once.

    <venv>/bin/python -m benchmarks.fault_sweep [--modes vllm-src,installed,...] [--release V]
        [--inside 0.005,0.05] [--pairs 10]

--inside also kills inside every subprocess step (git) that long after it starts: a timing sample
on top of the step sweep. --pairs starts that many pairs of simultaneous runs on one tree and on one
installation. Prints a line per mode; each failure in full. Exit 1 on any failure.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mtpq.core import gittree
from mtpq.core.pin import load_pins, newest_pin
from mtpq.core.series import load_series
from tests import faults

ROOT = Path(__file__).resolve().parent.parent


def sweep_mode(name: str, pin, series, work: Path, delays: list[str]) -> list[str]:
    scenario = faults.SCENARIOS[name](gittree.pinned_tree(pin), pin, series, work)
    start = time.perf_counter()
    logged = faults.steps(scenario, work)
    subprocesses = [index + 1 for index, line in enumerate(logged) if line.startswith("run ")]
    plan = [(point, "") for point in range(1, len(logged) + 1)]
    plan += [(point, delay) for delay in delays for point in subprocesses]
    killed = finished = 0
    failures = []
    for point, delay in plan:
        was_killed, failure = faults.kill_and_check(scenario, point, logged, work, delay)
        killed += was_killed
        finished += not was_killed
        if failure:
            failures.append(failure)
    print(
        f"{name:31} {len(logged):4} steps ({len(subprocesses)} subprocesses), {len(plan):5} kills: "
        f"{killed} killed mid-run, {finished} ended first; {len(plan) - len(failures)} checked good, "
        f"{len(failures)} failed ({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    return failures


def pairs(pin, series, work: Path, count: int) -> list[str]:
    """`count` pairs of simultaneous runs on one checkout and on one installation."""
    failures = []
    for scenario_name in ("vllm-src", "installed"):
        (work / scenario_name).mkdir(parents=True)
        scenario = faults.SCENARIOS[scenario_name](
            gittree.pinned_tree(pin), pin, series, work / scenario_name
        )
        command = [sys.executable, str(faults.APPLY), *scenario.args]
        env = {**os.environ, **scenario.env}
        for pair in range(count):
            scenario.reset()
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
            runs = [subprocess.Popen(command, env=env, **pipes) for _ in "ab"]
            outputs = [run.communicate(timeout=600) for run in runs]
            try:
                assert [run.returncode for run in runs] == [0, 0], f"{outputs}"
                scenario.check()
            except AssertionError as error:
                failures.append(f"{scenario_name} pair {pair}: {error}")
        print(
            f"{scenario_name:31} {count} pairs of simultaneous runs: {count - len(failures)} good", flush=True
        )
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(faults.SCENARIOS))
    parser.add_argument("--release", help="a pinned vLLM release (default: the newest)")
    parser.add_argument("--inside", default="", help="comma-separated delays in seconds")
    parser.add_argument("--pairs", type=int, default=0)
    args = parser.parse_args()
    pins = load_pins()
    pin = pins[args.release] if args.release else newest_pin(pins)
    series = load_series(pin.series_dir)
    print(f"vLLM {pin.version}, series {series.directory.name} ({series.series_id})", flush=True)
    delays = [delay for delay in args.inside.split(",") if delay]
    failures = []
    with tempfile.TemporaryDirectory(prefix="mtpq-fault-sweep-") as scratch:
        for name in args.modes.split(","):
            work = Path(scratch) / name
            work.mkdir()
            failures += sweep_mode(name, pin, series, work, delays)
            shutil.rmtree(work)
        if args.pairs:
            failures += pairs(pin, series, Path(scratch) / "pairs", args.pairs)
    for failure in failures:
        print(f"FAILED {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
