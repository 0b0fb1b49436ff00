"""The GPU run's record: the host's output (benchmarks/gpu_run.py: host.json, runs.jsonl) turned into
benchmarks/gpu_results/<date>-<gpu>.json and README.md's GPU table.

    python3 -m benchmarks.gpu_record DIR      # DIR: the files the device tool brought back from $OUT
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


def runs_of(out: Path) -> dict[str, dict]:
    return {run["key"]: run for run in map(json.loads, (out / "runs.jsonl").read_text().splitlines())}


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
        "series_equals_bf16": bool(
            on
            and reference
            and "error" not in on
            and "error" not in reference
            and on["acceptance"] == reference["acceptance"]
        ),
        "greedy_equal_to_mtp_off": {
            batch: bool(
                mtp_on
                and mtp_off
                and "outputs" in mtp_on
                and "outputs" in mtp_off
                and mtp_on["outputs"] == mtp_off["outputs"]
            )
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
    for row in record["rows"]:
        rates, equal = row["tokens_per_s"], row["greedy_equal_to_mtp_off"]
        lines.append(
            f"| {row['case']} | {row['stock'][:80]} | {row['series'][:60]} ({row['bf16_reference'][:40]}) "
            f"| {' / '.join('yes' if equal[batch] else 'no' for batch in BATCHES[::-1])} "
            f"| {' / '.join(map(str, rates[BATCHES[1]]))} | {' / '.join(map(str, rates[BATCHES[0]]))} "
            f"| {row['peak_gpu_gib']} | {' / '.join(map(str, row['startup_s']))} |"
        )
    return "\n".join(lines)


def record(out: Path) -> Path:
    host = json.loads((out / "host.json").read_text())
    runs = runs_of(out)
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
    parser.add_argument("out", type=Path, help="the GPU run's output: host.json, runs.jsonl")
    args = parser.parse_args(argv)
    print(f"wrote {record(args.out).relative_to(ROOT)} and README.md's GPU table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
