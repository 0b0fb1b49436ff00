"""MTP acceptance before/after the series, output tokens/s with MTP on and off, engine start-up with and
without the series, and the detector's cost, on one test-bed target.

Run with a test bed's interpreter (`python3 tests/run.py --venv [--target V]` prints the venv), whose
vLLM is patched; the unpatched baseline is the same wheel's `vllm/` on PYTHONPATH. Prints figures,
asserts nothing. The engine runs are the end-to-end suite's plan (tests/e2e_cases.py), batched one
probe process per vLLM variant and tensor-parallel size as the tests batch them.

  <venv>/bin/python -m benchmarks.mtp_acceptance [--startup-runs N] [--max-tokens N] [--skip-engines]
      [--arch ARCH ...]
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from mtpq.core.installed import find_installation, installed_version
from tests import checkpoints
from tests.e2e_cases import (
    CASES,
    E2E_FAMILIES,
    QUANTIZED_MTP,
    QUANTIZER_EXPORTS,
    QWEN3_5_ALL,
    QWEN3_5_FAMILIES,
    TENSOR_PARALLEL_CASES,
    TENSOR_PARALLEL_SIZE,
    EngineRun,
    baseline,
    engine_plan,
    engine_specs,
    of_architectures,
)
from tests.header_checkpoints import DSV3_LAYERS, write_deepseek_v3_shaped
from tests.probing import run_probe
from tests.run import beds, ensure_unpatched_vllm


def probe(variant: str, batch: dict) -> dict[str, dict]:
    """Run a batch of engine runs under the patched (this interpreter's) or unpatched vLLM."""
    installation = find_installation(sys.executable)
    pin = next(pin for pin in beds() if pin.version == installed_version(installation))
    unpatched = ensure_unpatched_vllm(pin)
    return run_probe("engine_acceptance", variant, unpatched, installation.package_dir, json.dumps(batch))[
        "runs"
    ]


def checkpoint_source(scratch: Path, stock_vllm: str):
    """checkpoint_of(case) for engine_specs: each case's checkpoint written (or grafted) once."""
    store = checkpoints.CheckpointStore(
        lambda name: Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch)), stock_vllm
    )
    return lambda case: store(case.quant, case.arch, **case.options)


def describe(report: dict) -> str:
    if "error" in report:
        return f"error: {report['error'][:90]}"
    return f"{report['acceptance']:.3f} ({report['accepted_tokens']}/{report['draft_tokens']})"


def acceptance_table(checkpoint_of, target: str, newest_target: bool, archs: list[str] | None) -> None:
    plan = of_architectures(engine_plan(target, newest_target), archs)
    reports = {}
    for kind in dict.fromkeys(run.kind for run in plan):
        reports |= probe(kind[0], engine_specs([run for run in plan if run.kind == kind], checkpoint_of))
    print("acceptance (MTP k=2, 4 prompts x 32 tokens), stock vLLM -> with the series (auto)")
    for case in of_architectures([*CASES, QUANTIZED_MTP, *QUANTIZER_EXPORTS, *QWEN3_5_ALL], archs):
        if reason := case.cannot_run(target):
            print(f"  {case.name():36} not run: {reason}", flush=True)
            continue
        before, after = (reports[EngineRun(variant, case, {}).key] for variant in ("unpatched", "patched"))
        print(f"  {case.name():36} {describe(before):60} -> {describe(after)}", flush=True)
    for arch in (*E2E_FAMILIES, *QWEN3_5_FAMILIES):
        if (run := EngineRun("patched", baseline(arch), {})).key in reports:
            print(f"  {arch + '-bf16 (baseline)':36} {describe(reports[run.key])}", flush=True)
    if newest_target:
        print(f"tensor_parallel_size={TENSOR_PARALLEL_SIZE}, stock -> with the series")
        for case in of_architectures(TENSOR_PARALLEL_CASES, archs):
            runs = [
                EngineRun(variant, case, {}, TENSOR_PARALLEL_SIZE) for variant in ("unpatched", "patched")
            ]
            before, after = (describe(reports[run.key]) if run.key in reports else "not run" for run in runs)
            print(f"  {case.name():36} {before:60} -> {after}", flush=True)


def throughput_table(checkpoint_of, target: str, max_tokens: int, archs: list[str] | None) -> None:
    """Every end-to-end case with the series: acceptance and output tokens/s, MTP on and off."""
    cases = [baseline(arch) for arch in (*E2E_FAMILIES, *QWEN3_5_FAMILIES)]
    cases += [*CASES, QUANTIZED_MTP, *QUANTIZER_EXPORTS, *QWEN3_5_ALL]
    cases = [case for case in of_architectures(cases, archs) if not case.cannot_run(target)]
    runs = [EngineRun("patched", case, speculative) for case in cases for speculative in ({}, None)]
    specs = engine_specs(runs, checkpoint_of)
    for spec in specs.values():
        spec |= {"max_tokens": max_tokens, "warmup": True}
    reports = probe("patched", specs)
    print(f"with the series, in-process, 4 prompts x {max_tokens} tokens (MTP k=2), after one warm-up")
    print(f"  {'case':36} {'acceptance':>10} {'tok/s MTP on':>13} {'tok/s MTP off':>14} {'speed-up':>9}")
    for case in cases:
        on, off = (reports[EngineRun("patched", case, speculative).key] for speculative in ({}, None))
        if "error" in on or "error" in off:
            print(f"  {case.name():36} {describe(on if 'error' in on else off)}", flush=True)
            continue
        rates = [sum(map(len, report["outputs"])) / report["generate_s"] for report in (on, off)]
        print(
            f"  {case.name():36} {on['acceptance']:>10.3f} {rates[0]:>13.1f} {rates[1]:>14.1f}"
            f" {rates[0] / rates[1]:>8.2f}x",
            flush=True,
        )


def startup_table(checkpoint_of, runs: int) -> None:
    case = CASES[0]
    print(f"engine start-up in-process, MTP off, {case.name()}, {runs} run(s) each (s)")
    (spec,) = engine_specs([EngineRun("patched", case)], checkpoint_of).values()
    batch = {f"run {index}": spec for index in range(runs)}
    for variant in ("unpatched", "patched"):
        times = [report["startup_s"] for report in probe(variant, batch).values()]
        print(f"  {variant:10} median {statistics.median(times):5.1f}  runs {times}", flush=True)


def detector_table(scratch: Path) -> None:
    from vllm.transformers_utils import mtp_checkpoint

    print("detector: header bytes read / checkpoint bytes")
    rows = [
        ("mimo int8_w8a8 (engineered, tiny)", scratch / "detector-mimo", 2),
        ("DeepSeek-V3-shaped FP8, sparse", scratch / "dsv3", DSV3_LAYERS),
    ]
    checkpoints.make_checkpoint(checkpoints.MIMO, rows[0][1], "int8_w8a8")
    write_deepseek_v3_shaped(rows[1][1], shards_per_layer=1)
    for label, directory, num_hidden_layers in rows:
        survey = mtp_checkpoint.survey_mtp_checkpoint(directory, num_hidden_layers, 1)
        share = 100 * survey.bytes_read / survey.checkpoint_bytes
        print(
            f"  {label:36} {survey.bytes_read:>10,} of {survey.checkpoint_bytes:>16,} B = {share:.6f} %"
            f"  ({len(survey.files)} of {len(list(directory.glob('*.safetensors')))} files)"
        )
        print(f"    {mtp_checkpoint.decide_draft_quantization(survey).summary}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--startup-runs", type=int, default=2, help="0: no start-up table")
    parser.add_argument("--skip-engines", action="store_true", help="only the detector figures")
    parser.add_argument("--max-tokens", type=int, default=128, help="per prompt, in the throughput table")
    parser.add_argument("--arch", nargs="+", help="only these architectures' cases (e2e_cases.py names)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mtpq-bench-") as scratch:
        detector_table(Path(scratch))
        if not args.skip_engines:
            version = installed_version(find_installation(sys.executable))
            checkpoint_of = checkpoint_source(Path(scratch), stock_vllm=version)
            newest_target = version == beds()[-1].version
            acceptance_table(checkpoint_of, version, newest_target, args.arch)
            throughput_table(checkpoint_of, version, args.max_tokens, args.arch)
            if args.startup_runs > 0:
                startup_table(checkpoint_of, args.startup_runs)


if __name__ == "__main__":
    main()
