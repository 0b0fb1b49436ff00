"""Run drafters' targets with MTP on the real CPU engine, dummy weights, and report where each stops.

Usage: python engine_limits.py KEY [KEY...]  (registry drafter keys, e.g. LongCatFlashMTPModel)

Each target is the drafter matrix's tiny config of the drafter's first target (drafter_matrix.py) or of
the one LIMIT_TARGETS names, its MLA at the sizes vLLM's CPU MLA takes (checkpoints.MLA_SIZES) and its
heads at the CPU attention's smallest head size; the engine runs in this process, one after another.
Prints one JSON object as the last stdout line:
{"vllm_file": ..., "runs": {key: {"tokens": [...]} or {"error_type", "error", "at"}}},
"at" being the innermost vLLM frame ("vllm/<file>:<line>") the exception was raised from.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from mtpq.upstream.drafters import directory_reader, read_drafters
from tests.checkpoints import HEAD_DIM, MLA_SIZES, _write_tokenizer
from tests.probes import drafter_matrix

# Fields a drafter's target model reads that the drafter matrix's config (its class's defaults) leaves
# unset: LongCat-Flash's release sets its zero experts to identity; MiniMax-M3's target builds its vision
# tower from a dict its config class leaves None (a tiny tower here); Qwen4-exp's linear attention needs
# its output gate named (vLLM's Gated DeltaNet refuses None, which transformers reads as hidden_act).
RELEASE_FIELDS = {
    "LongCatFlashMTPModel": {"zero_expert_type": "identity"},
    "MiniMaxM3MTP": {
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "patch_size": 14,
            "num_channels": 3,
            "layer_norm_eps": 1e-5,
            "img_token_compression_config": {"spatial_merge_size": 2, "temporal_patch_size": 2},
        }
    },
    "Qwen4ExpMTP": {"text_config": {"output_gate_type": "silu"}},
    # Inkling's config defaults route every layer to an MoE without experts (its releases set them);
    # dense MLPs in every layer are a layout the model builds.
    "InklingMTPModel": {"dense_mlp_idx": drafter_matrix.SIZES["num_hidden_layers"]},
}
# Files besides config.json a target's start-up reads, each written empty (the class defaults are the
# release's): MiniMax-M3's processor loads its image processor even where no prompt carries an image.
RELEASE_FILES = {"MiniMaxM3MTP": ("preprocessor_config.json",)}
# Targets run instead of the drafter's first: Inkling's text-only model. Its multimodal one stops earlier
# in an in-process engine, on no limit of the family: the Inkling processor imports numba, and the CPU
# worker's Triton override scan of every module (vllm/triton_utils/dispatcher.py:139) then fails on
# llvmlite's library object.
LIMIT_TARGETS = {"InklingMTPModel": ("inkling_model", "InklingForCausalLM")}
# Engine arguments a target needs here: Inkling's own tokenizer mode wants the special tokens of its
# releases' vocabulary, which the tiny tokenizer lacks (the prompts are token ids).
ENGINE_ARGS = {"InklingMTPModel": {"tokenizer_mode": "hf"}}


def _engine_sizes(config: dict) -> None:
    """The CPU engine's sizes, in place (nested configs too)."""
    if "head_dim" in config:
        config["head_dim"] = HEAD_DIM
    if "kv_lora_rank" in config:
        config.update(MLA_SIZES.hf_config())
    for value in config.values():
        if isinstance(value, dict):
            _engine_sizes(value)


def _innermost_vllm_frame(error: BaseException) -> str:
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if "/vllm/" in frame.filename]
    frame = frames[-1]
    return f"vllm/{frame.filename.rsplit('/vllm/', 1)[1]}:{frame.lineno}"


def run(drafter, directory: Path) -> dict:
    from vllm import LLM, SamplingParams

    model_type, architecture = LIMIT_TARGETS.get(drafter.key) or drafter_matrix._targets(drafter)[0]
    config = drafter_matrix.target_config(drafter, model_type, architecture)
    config = drafter_matrix._merged(config, RELEASE_FIELDS.get(drafter.key, {}))
    _engine_sizes(config)
    (directory / "config.json").write_text(json.dumps(config))
    _write_tokenizer(directory)
    for name in RELEASE_FILES.get(drafter.key, ()):
        (directory / name).write_text("{}")
    try:
        llm = LLM(
            model=str(directory),
            load_format="dummy",
            max_model_len=256,
            enforce_eager=True,
            enable_prefix_caching=False,
            trust_remote_code=True,
            dtype="bfloat16",
            speculative_config={"method": "mtp", "num_speculative_tokens": 1},
            **ENGINE_ARGS.get(drafter.key, {}),
        )
        outputs = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], SamplingParams(max_tokens=8))
    # Where the engine stops is the finding.
    except Exception as error:  # noqa: BLE001
        return {"error_type": type(error).__name__, "error": str(error), "at": _innermost_vllm_frame(error)}
    return {"tokens": list(outputs[0].outputs[0].token_ids)}


def main(keys: list[str]) -> None:
    import vllm

    drafters = {
        drafter.key: drafter for drafter in read_drafters(directory_reader(Path(vllm.__file__).parents[1]))
    }
    runs = {}
    for key in keys:
        with tempfile.TemporaryDirectory(prefix=f"mtpq-limit-{key}-") as directory:
            runs[key] = run(drafters[key], Path(directory))
    print(json.dumps({"vllm_file": vllm.__file__, "runs": runs}))


if __name__ == "__main__":
    main(sys.argv[1:])
