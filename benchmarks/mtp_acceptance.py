#!/usr/bin/env python3
"""MTP acceptance before/after the series, engine start-up with and without it, and the detector's cost.

Run with the test bed's interpreter (`python3 tests/run.py --venv` prints the venv), whose vLLM is
patched; the unpatched baseline is the same wheel's `vllm/` on PYTHONPATH. Prints figures, asserts
nothing. Every engine start is a separate process (the CPU platform spawns its workers).

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

import checkpoints  # noqa: E402
from e2e_cases import CASES, MTP, QUANTIZED_MTP  # noqa: E402
from probing import run_probe  # noqa: E402
from run import ensure_unpatched_vllm  # noqa: E402

# A DeepSeek-V3-shaped checkpoint (61 decoder layers + 1 MTP layer, 256 FP8 block-scaled experts a
# layer, one shard a layer) whose tensor data is a sparse hole: only its headers are real.
DSV3_LAYERS, DSV3_EXPERTS, DSV3_HIDDEN, DSV3_EXPERT_DIM = 61, 256, 7168, 2048


def engine_report(variant: str, checkpoint: Path, speculative: dict | None) -> dict:
    import vllm

    args = [str(checkpoint)]
    if speculative is not None:
        args += ["--speculative-config", json.dumps(speculative)]
    patched = Path(vllm.__file__).parent
    return run_probe("engine_acceptance", variant, ensure_unpatched_vllm(), patched, *args)


def describe(report: dict) -> str:
    if "error" in report:
        return f"error: {report['error'][:90]}"
    return f"{report['acceptance']:.3f} ({report['accepted_tokens']}/{report['draft_tokens']})"


def acceptance_table(scratch: Path) -> None:
    print("acceptance (MTP k=2, 4 prompts x 32 tokens), stock vLLM 0.22.1 -> with the series (auto)")
    for case in [*CASES, QUANTIZED_MTP]:
        architecture = checkpoints.ARCHITECTURES[case.arch]
        checkpoint = checkpoints.make_checkpoint(
            architecture, scratch / case.name(), case.quant, **case.options
        )
        before = engine_report("unpatched", checkpoint, MTP)
        after = engine_report("patched", checkpoint, MTP)
        print(f"  {case.name():32} {describe(before):60} -> {describe(after)}", flush=True)
    for arch, architecture in checkpoints.ARCHITECTURES.items():
        report = engine_report(
            "patched", checkpoints.make_checkpoint(architecture, scratch / f"{arch}-bf16"), MTP
        )
        print(f"  {arch + '-bf16 (baseline)':32} {describe(report)}", flush=True)


def startup_table(scratch: Path, runs: int) -> None:
    checkpoint = checkpoints.make_checkpoint(checkpoints.MIMO, scratch / "startup", "int8_w8a8")
    print(f"engine start-up, MTP off, mimo int8_w8a8, {runs} run(s) each (s)")
    for variant in ("unpatched", "patched"):
        times = [engine_report(variant, checkpoint, None)["startup_s"] for _ in range(runs)]
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
            acceptance_table(Path(scratch))
            startup_table(Path(scratch), args.startup_runs)


if __name__ == "__main__":
    main()
