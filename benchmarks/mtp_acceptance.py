#!/usr/bin/env python3
"""MTP acceptance before/after the series, engine start-up with and without it, and the detector's cost,
on one test-bed target.

Run with a test bed's interpreter (`python3 tests/run.py --venv [--target V]` prints the venv), whose
vLLM is patched; the unpatched baseline is the same wheel's `vllm/` on PYTHONPATH. Prints figures,
asserts nothing. The engine runs are the end-to-end suite's plan (tests/e2e_cases.py), batched one
probe process per vLLM variant and tensor-parallel size as the tests batch them.

  <venv>/bin/python benchmarks/mtp_acceptance.py [--startup-runs N] [--skip-engines]
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import checkpoints  # noqa: E402
from e2e_cases import (  # noqa: E402
    ARCHITECTURES,
    CASES,
    QUANTIZED_MTP,
    TENSOR_PARALLEL_CASES,
    TENSOR_PARALLEL_SIZE,
    EngineRun,
    baseline,
    engine_plan,
    engine_specs,
)
from probing import run_probe  # noqa: E402
from run import ensure_unpatched_vllm, targets  # noqa: E402

from mtpq.installed import find_installation, installed_version  # noqa: E402

# A DeepSeek-V3-shaped checkpoint (61 decoder layers + 1 MTP layer, 256 FP8 block-scaled experts a
# layer, one shard a layer) whose tensor data is a sparse hole: only its headers are real.
DSV3_LAYERS, DSV3_EXPERTS, DSV3_HIDDEN, DSV3_EXPERT_DIM = 61, 256, 7168, 2048


def probe(variant: str, batch: dict) -> dict[str, dict]:
    """Run a batch of engine runs under the patched (this interpreter's) or unpatched vLLM."""
    installation = find_installation(sys.executable)
    pin = next(pin for pin in targets() if pin.version == installed_version(installation))
    unpatched = ensure_unpatched_vllm(pin)
    return run_probe("engine_acceptance", variant, unpatched, installation.package_dir, json.dumps(batch))[
        "runs"
    ]


def checkpoint_in(scratch: Path):
    def checkpoint_of(case) -> Path:
        out = scratch / case.name()
        if not out.exists():
            out.mkdir()
            checkpoints.make_checkpoint(checkpoints.ARCHITECTURES[case.arch], out, case.quant, **case.options)
        return out

    return checkpoint_of


def describe(report: dict) -> str:
    if "error" in report:
        return f"error: {report['error'][:90]}"
    return f"{report['acceptance']:.3f} ({report['accepted_tokens']}/{report['draft_tokens']})"


def acceptance_table(scratch: Path, newest_target: bool) -> None:
    plan = engine_plan(newest_target)
    reports = {}
    for kind in dict.fromkeys(run.kind for run in plan):
        reports |= probe(
            kind[0], engine_specs([run for run in plan if run.kind == kind], checkpoint_in(scratch))
        )
    print("acceptance (MTP k=2, 4 prompts x 32 tokens), stock vLLM -> with the series (auto)")
    for case in [*CASES, QUANTIZED_MTP]:
        before, after = (reports[EngineRun(variant, case, {}).key] for variant in ("unpatched", "patched"))
        print(f"  {case.name():36} {describe(before):60} -> {describe(after)}", flush=True)
    for arch in ARCHITECTURES:
        report = reports[EngineRun("patched", baseline(arch), {}).key]
        print(f"  {arch + '-bf16 (baseline)':36} {describe(report)}", flush=True)
    if newest_target:
        print(f"tensor_parallel_size={TENSOR_PARALLEL_SIZE}, stock -> with the series")
        for case in TENSOR_PARALLEL_CASES:
            runs = [
                EngineRun(variant, case, {}, TENSOR_PARALLEL_SIZE) for variant in ("unpatched", "patched")
            ]
            before, after = (describe(reports[run.key]) if run.key in reports else "not run" for run in runs)
            print(f"  {case.name():36} {before:60} -> {after}", flush=True)


def startup_table(scratch: Path, runs: int) -> None:
    case = CASES[0]
    print(f"engine start-up in-process, MTP off, {case.name()}, {runs} run(s) each (s)")
    (spec,) = engine_specs([EngineRun("patched", case)], checkpoint_in(scratch)).values()
    batch = {f"run {index}": spec for index in range(runs)}
    for variant in ("unpatched", "patched"):
        times = [report["startup_s"] for report in probe(variant, batch).values()]
        print(f"  {variant:10} median {statistics.median(times):5.1f}  runs {times}", flush=True)


def write_sparse_dsv3_checkpoint(out: Path) -> None:
    """Headers as DeepSeek-V3's FP8 release lays them out; data left as holes (no disk used)."""
    weight_map = {}
    for layer in range(DSV3_LAYERS + 1):
        prefix = f"model.layers.{layer}"
        shapes = {f"{prefix}.self_attn.{name}": shape for name, shape in _attention_shapes().items()}
        for expert in range(DSV3_EXPERTS):
            for name, shape in _expert_shapes().items():
                shapes[f"{prefix}.mlp.experts.{expert}.{name}"] = shape
        if layer == DSV3_LAYERS:
            shapes |= {f"{prefix}.eh_proj.weight": ("BF16", [DSV3_HIDDEN, 2 * DSV3_HIDDEN])}
        file = f"model-{layer:05d}.safetensors"
        _write_header_only(out / file, shapes)
        weight_map.update(dict.fromkeys(shapes, file))
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _attention_shapes() -> dict:
    return {
        "q_a_proj.weight": ("F8_E4M3", [1536, DSV3_HIDDEN]),
        "q_a_proj.weight_scale_inv": ("F32", [12, 56]),
        "kv_a_proj_with_mqa.weight": ("F8_E4M3", [576, DSV3_HIDDEN]),
        "kv_a_proj_with_mqa.weight_scale_inv": ("F32", [5, 56]),
        "o_proj.weight": ("F8_E4M3", [DSV3_HIDDEN, 16384]),
        "o_proj.weight_scale_inv": ("F32", [56, 128]),
    }


def _expert_shapes() -> dict:
    return {
        "gate_proj.weight": ("F8_E4M3", [DSV3_EXPERT_DIM, DSV3_HIDDEN]),
        "gate_proj.weight_scale_inv": ("F32", [16, 56]),
        "up_proj.weight": ("F8_E4M3", [DSV3_EXPERT_DIM, DSV3_HIDDEN]),
        "up_proj.weight_scale_inv": ("F32", [16, 56]),
        "down_proj.weight": ("F8_E4M3", [DSV3_HIDDEN, DSV3_EXPERT_DIM]),
        "down_proj.weight_scale_inv": ("F32", [56, 16]),
    }


_DTYPE_BYTES = {"F8_E4M3": 1, "BF16": 2, "F32": 4}


def _write_header_only(path: Path, shapes: dict) -> None:
    entries, offset = {}, 0
    for name, (dtype, shape) in shapes.items():
        size = _DTYPE_BYTES[dtype] * shape[0] * shape[1]
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(entries).encode()
    with open(path, "wb") as file:
        file.write(len(header).to_bytes(8, "little") + header)
        file.truncate(8 + len(header) + offset)


def detector_table(scratch: Path) -> None:
    from vllm.transformers_utils import mtp_checkpoint

    print("detector: header bytes read / checkpoint bytes")
    rows = [
        ("mimo int8_w8a8 (engineered, tiny)", scratch / "detector-mimo", 2),
        ("DeepSeek-V3-shaped FP8, sparse", scratch / "dsv3", DSV3_LAYERS),
    ]
    checkpoints.make_checkpoint(checkpoints.MIMO, rows[0][1], "int8_w8a8")
    rows[1][1].mkdir()
    write_sparse_dsv3_checkpoint(rows[1][1])
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
    parser.add_argument("--startup-runs", type=int, default=2)
    parser.add_argument("--skip-engines", action="store_true", help="only the detector figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mtpq-bench-") as scratch:
        detector_table(Path(scratch))
        if not args.skip_engines:
            newest_target = installed_version(find_installation(sys.executable)) == targets()[-1].version
            acceptance_table(Path(scratch), newest_target)
            startup_table(Path(scratch), args.startup_runs)


if __name__ == "__main__":
    main()
