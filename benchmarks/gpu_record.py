"""The GPU run's record: the host's output (benchmarks/gpu_run.py: host.json, runs.jsonl) turned into
benchmarks/gpu_results/<date>-<gpu>.json and README.md's GPU table.

    python3 -m benchmarks.gpu_record DIR [DIR ...]   # the files the device tool brought back from $OUT

Several DIRs (host commands of one lease, say a short run and a longer one) are one record: a run measured
in an earlier DIR is kept, later DIRs add the runs it lacks.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from benchmarks.gpu_run import BATCHES, MAX_TOKENS, ROWS, GpuRun, plan
from tests.e2e_cases import EngineRun, baseline

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "gpu_results"
README = ROOT / "README.md"
TABLE_START, TABLE_END = "<!-- gpu-results start -->", "<!-- gpu-results end -->"
REPRODUCE = "python3 -m benchmarks.gpu_kit build, then .gpukit/host-commands.json's calls on the GPU host"
# Kept of each run's report: its outputs are compared here, not recorded.
KEPT = ("acceptance", "accepted_tokens", "draft_tokens", "startup_s", "generate_s", "peak_gpu_bytes", "error")


def runs_of(outs: list[Path]) -> dict[str, dict]:
    """Each run's report, the first DIR's where several measured it; runs that did not finish left out."""
    runs: dict[str, dict] = {}
    for out in outs:
        for run in map(json.loads, (out / "runs.jsonl").read_text().splitlines()):
            if run["key"] not in runs or "error" in runs[run["key"]]:
                runs[run["key"]] = run
    return runs


def measured(*runs: dict | None) -> bool:
    return all(run is not None and "error" not in run for run in runs)


def tokens_per_s(run: dict | None) -> float | None:
    if not run or "error" in run:
        return None
    return round(sum(map(len, run["outputs"])) / run["generate_s"], 1)


def outcome(run: dict | None) -> str:
    if run is None:
        return "not run"
    if "error" in run:
        return run["error"]
    return f"acceptance {run['acceptance']:.3f} ({run['accepted_tokens']}/{run['draft_tokens']})"


def row_record(case, runs: dict[str, dict]) -> dict:
    def run(variant, of, speculative, batch, eager=False):
        return runs.get(GpuRun(EngineRun(variant, of, speculative), batch, eager).key)

    big = BATCHES[0]
    series = {
        batch: (run("patched", case, {}, batch), run("patched", case, None, batch)) for batch in BATCHES
    }
    on = series[big][0]
    reference = run("patched", baseline(case.arch), {}, big)
    eager = run("patched", case, {}, big, eager=True)
    return {
        "case": case.name(),
        "stock": outcome(run("unpatched", case, {}, big)),
        "series": outcome(on),
        "bf16_reference": outcome(reference),
        # None: not both measured.
        "series_equals_bf16": (on["acceptance"] == reference["acceptance"])
        if measured(on, reference)
        else None,
        "greedy_equal_to_mtp_off": {
            batch: mtp_on["outputs"] == mtp_off["outputs"] if measured(mtp_on, mtp_off) else None
            for batch, (mtp_on, mtp_off) in series.items()
        },
        "tokens_per_s": {
            batch: [tokens_per_s(mtp_on), tokens_per_s(mtp_off)]
            for batch, (mtp_on, mtp_off) in series.items()
        },
        "peak_gpu_gib": round(on["peak_gpu_bytes"] / 2**30, 2) if on and on.get("peak_gpu_bytes") else None,
        "startup_s": [side.get("startup_s") if side else None for side in series[big]],
        "eager": outcome(eager) if eager else None,
    }


def table(record: dict) -> str:
    lines = [
        f"Host: {record['host']['gpu']}; torch {record['host']['torch']} (CUDA {record['host']['cuda']}), "
        f"Python {record['host']['python']}; MTP k=2, {MAX_TOKENS} tokens a prompt, CUDA graphs; tok/s MTP "
        f"on / off; start-up with MTP on / off. Reproduce: {REPRODUCE}.",
        "",
        "| checkpoint (MTP layer BF16) | stock vLLM, MTP on | with the series (BF16 model's) "
        f"| greedy = MTP off (batch {BATCHES[1]} / {BATCHES[0]}) "
        f"| tok/s batch {BATCHES[1]} | tok/s batch {BATCHES[0]} | peak GiB | start-up s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ran = [row for row in record["rows"] if row["series"] != "not run"]
    for row in ran:
        rates, equal = row["tokens_per_s"], row["greedy_equal_to_mtp_off"]
        lines.append(
            f"| {row['case']} | {row['stock'][:80]} | {row['series'][:60]} ({row['bf16_reference'][:40]}) "
            f"| {' / '.join(_shown(equal[batch]) for batch in BATCHES[::-1])} "
            f"| {' / '.join(map(_shown, rates[BATCHES[1]]))} | {' / '.join(map(_shown, rates[BATCHES[0]]))} "
            f"| {_shown(row['peak_gpu_gib'])} | {' / '.join(map(_shown, row['startup_s']))} |"
        )
    if not_run := [row["case"] for row in record["rows"] if row not in ran]:
        lines += ["", f"Not run on a GPU yet: {', '.join(not_run)}."]
    return "\n".join(lines)


def _shown(value) -> str:
    """A table cell: yes / no for a comparison, "–" for what was not measured."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def record(outs: list[Path]) -> Path:
    host = json.loads((outs[0] / "host.json").read_text())
    runs = runs_of(outs)
    result = {
        "host": host,
        "rows": [row_record(case, runs) for case in ROWS],
        "runs": {
            gpu_run.key: {key: runs[gpu_run.key][key] for key in KEPT if key in runs[gpu_run.key]}
            for gpu_run in plan()
            if gpu_run.key in runs
        },
    }
    RESULTS.mkdir(exist_ok=True)
    gpu = re.sub(r"\W+", "-", host["gpu"].split(",")[0]).strip("-").lower()
    path = RESULTS / f"{host['started'][:10]}-{gpu}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    readme = README.read_text()
    before, _, rest = readme.partition(TABLE_START)
    _, _, after = rest.partition(TABLE_END)
    README.write_text(f"{before}{TABLE_START}\n{table(result)}\n{TABLE_END}{after}")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="+", help="the GPU run's output: host.json, runs.jsonl")
    args = parser.parse_args(argv)
    print(f"wrote {record(args.out).relative_to(ROOT)} and README.md's GPU table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
