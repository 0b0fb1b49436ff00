"""Probe section: the MTP draft of Step-3.5 quantized checkpoints, built and loaded (seed 002).

Each run writes a tiny Step3p5ForCausalLM checkpoint: config.json with the ``quantization_config``
ModelOpt (0.31 and later) exports for NVFP4 (quant_method "modelopt", quant_algo "NVFP4", group size
16, lm_head excluded) or a compressed-tensors INT8 W8A8 one, and a model.safetensors holding only what
the draft loads (the MTP layer ``model.layers.{num_hidden_layers}.*`` and ``model.embed_tokens``) with
small random values, stored one of four ways: every tensor BF16 (what seed 002's grafted checkpoint
holds); the MTP decoder block's linears as ModelOpt NVFP4 (U8 weight [out, in/2], F8_E4M3
weight_scale [out, in/16], F32 scalar weight_scale_2 and input_scale); as INT8 W8A8; or as INT8 W8A8
with the MTP head too — all around BF16 norms, eh_proj, head and embeddings.

For every run in RUNS it builds and loads the draft (mtp_vllm.build_and_load; only the NVFP4 GEMM
kernel choice is stood in for, vLLM has none for CPU). Runs that set draft_quant_config are left out
under stock vLLM, which has no such option.

Result: ``{"hf_config": {...}, "runs": {run: build_and_load(...)}}``. When a shape assertion stopped
the load (stock vLLM's bare one, or the one patched vLLM rewraps), the failure also has
``param_shape`` and ``loaded_shape`` from the asserting frame, the draft ``parameter``
Step3p5MTP.load_weights was filling and the parameters it had filled before (``loaded_before``).
"""

from __future__ import annotations

import json
import tempfile
import traceback
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.probes.mtp_vllm import (
    INT8_W8A8_QUANTIZATION_CONFIG,
    build_and_load,
    failure,
    has_draft_quant_config,
)

NUM_HIDDEN_LAYERS = 1
MTP_LAYER = f"model.layers.{NUM_HIDDEN_LAYERS}"
# NVFP4 packs two values a byte and scales each group of 16 inputs: every in-feature count
# (hidden, intermediate, heads x head_dim) is a multiple of 32.
HF_CONFIG = {
    "architectures": ["Step3p5ForCausalLM"],
    "model_type": "step3p5",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": NUM_HIDDEN_LAYERS,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 2,
    "num_attention_groups": 1,
    "head_dim": 64,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
}
NVFP4_GROUP_SIZE = 16
MODELOPT_NVFP4_QUANTIZATION_CONFIG = {
    "quant_method": "modelopt",
    "quant_algo": "NVFP4",
    "group_size": NVFP4_GROUP_SIZE,
    # config.json's name for hf_quant_config.json's exclude_modules.
    "ignore": ["lm_head"],
    "producer": {"name": "modelopt", "version": "0.31.0"},
}

# Checkpoint linears of the MTP decoder block: name -> (out features, in features).
_HIDDEN = HF_CONFIG["hidden_size"]
_INTERMEDIATE = HF_CONFIG["intermediate_size"]
_Q_WIDTH = HF_CONFIG["num_attention_heads"] * HF_CONFIG["head_dim"]
_KV_WIDTH = HF_CONFIG["num_attention_groups"] * HF_CONFIG["head_dim"]
BLOCK_LINEARS = {
    f"{MTP_LAYER}.self_attn.q_proj": (_Q_WIDTH, _HIDDEN),
    f"{MTP_LAYER}.self_attn.k_proj": (_KV_WIDTH, _HIDDEN),
    f"{MTP_LAYER}.self_attn.v_proj": (_KV_WIDTH, _HIDDEN),
    f"{MTP_LAYER}.self_attn.o_proj": (_HIDDEN, _Q_WIDTH),
    f"{MTP_LAYER}.mlp.gate_proj": (_INTERMEDIATE, _HIDDEN),
    f"{MTP_LAYER}.mlp.up_proj": (_INTERMEDIATE, _HIDDEN),
    f"{MTP_LAYER}.mlp.down_proj": (_HIDDEN, _INTERMEDIATE),
}
# Every other tensor the draft loads, always BF16: name -> shape.
BF16_TENSORS = {
    "model.embed_tokens.weight": (HF_CONFIG["vocab_size"], _HIDDEN),
    f"{MTP_LAYER}.eh_proj.weight": (_HIDDEN, 2 * _HIDDEN),
    f"{MTP_LAYER}.shared_head.output.weight": (HF_CONFIG["vocab_size"], _HIDDEN),
    **{
        f"{MTP_LAYER}.{norm}.weight": (_HIDDEN,)
        for norm in ("enorm", "hnorm", "shared_head.norm", "input_layernorm", "post_attention_layernorm")
    },
    **{f"{MTP_LAYER}.self_attn.{norm}.weight": (HF_CONFIG["head_dim"],) for norm in ("q_norm", "k_norm")},
}

# compressed-tensors INT8 W8A8 checkpoints with an INT8 MTP block (patch 0007: their KV-cache
# scales), one of them from a quantizer that also took the MTP layer's head, a target that reaches
# the draft's head only under the head's name (v0.22.1's patch 0006).
MTP_HEAD = f"{MTP_LAYER}.shared_head.output"
INT8_QUANTIZATION_CONFIG = {**INT8_W8A8_QUANTIZATION_CONFIG, "ignore": ["lm_head"]}
INT8_WITH_HEAD_QUANTIZATION_CONFIG = {
    **INT8_QUANTIZATION_CONFIG,
    "config_groups": {
        "group_0": {
            **INT8_W8A8_QUANTIZATION_CONFIG["config_groups"]["group_0"],
            "targets": ["Linear", r"re:.*\.shared_head\..*"],
        }
    },
}
QUANTIZATION_CONFIGS = {
    # Seed 002: an MTP layer grafted onto an NVFP4 release, which excludes lm_head only.
    "bf16": MODELOPT_NVFP4_QUANTIZATION_CONFIG,
    # A quantizer that took the MTP block lists the head it left BF16 (vLLM 0.32+ quantizes LM heads
    # under ModelOpt NVFP4 unless excluded).
    "nvfp4": {**MODELOPT_NVFP4_QUANTIZATION_CONFIG, "ignore": ["lm_head", f"{MTP_LAYER}.shared_head*"]},
    "int8": INT8_QUANTIZATION_CONFIG,
    "int8_with_head": INT8_WITH_HEAD_QUANTIZATION_CONFIG,
}

# run -> (storage, draft_quant_config or None for the default, "auto").
RUNS = {
    "bf16+auto": ("bf16", None),
    "nvfp4+auto": ("nvfp4", None),
    "bf16+target": ("bf16", "target"),
    "nvfp4+unquantized": ("nvfp4", "unquantized"),
    "int8+auto": ("int8", None),
    "int8_with_head+auto": ("int8_with_head", None),
}


def nvfp4_tensors(module: str, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
    """What ModelOpt writes for one NVFP4 linear (random packed values, plausible scales)."""
    return {
        f"{module}.weight": torch.randint(0, 256, (out_features, in_features // 2), dtype=torch.uint8),
        f"{module}.weight_scale": torch.rand(out_features, in_features // NVFP4_GROUP_SIZE).to(
            torch.float8_e4m3fn
        ),
        f"{module}.weight_scale_2": torch.tensor(1e-3, dtype=torch.float32),
        f"{module}.input_scale": torch.tensor(1e-2, dtype=torch.float32),
    }


def int8_tensors(module: str, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
    """What compressed-tensors writes for one INT8 W8A8 linear (per-channel scales)."""
    return {
        f"{module}.weight": torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8),
        f"{module}.weight_scale": torch.full((out_features, 1), 1e-3),
    }


def write_checkpoint(checkpoint_dir: Path, storage: str) -> None:
    hf_config = {**HF_CONFIG, "quantization_config": QUANTIZATION_CONFIGS[storage]}
    (checkpoint_dir / "config.json").write_text(json.dumps(hf_config))
    tensors = {name: 0.02 * torch.randn(shape, dtype=torch.bfloat16) for name, shape in BF16_TENSORS.items()}
    if storage == "int8_with_head":
        tensors |= int8_tensors(MTP_HEAD, HF_CONFIG["vocab_size"], _HIDDEN)
    for module, (out_features, in_features) in BLOCK_LINEARS.items():
        if storage == "nvfp4":
            tensors |= nvfp4_tensors(module, out_features, in_features)
        elif storage.startswith("int8"):
            tensors |= int8_tensors(module, out_features, in_features)
        else:
            tensors[f"{module}.weight"] = 0.02 * torch.randn(out_features, in_features, dtype=torch.bfloat16)
    save_file(tensors, checkpoint_dir / "model.safetensors")


def shape_assertion(error: Exception, assertion: AssertionError) -> dict:
    """What a bare ``assert param.shape == loaded.shape`` compared, read from the tracebacks: both
    shapes (the assertion's innermost frame), the draft parameter Step3p5MTP.load_weights was filling
    and the parameters it had filled before (a frame of the error raised, which is the assertion or
    the ValueError patched vLLM's weight loader wrapper raised from it)."""
    innermost = [frame for frame, _ in traceback.walk_tb(assertion.__traceback__)][-1].f_locals
    param = innermost.get("param_data", innermost.get("self"))
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)]
    loader = next(frame.f_locals for frame in reversed(frames) if "loaded_params" in frame.f_locals)
    return {
        "param_shape": list(param.data.shape),
        "loaded_shape": list(innermost["loaded_weight"].shape),
        "parameter": loader["name"],
        "loaded_before": sorted(loader["loaded_params"]),
    }


def load_failure(error: Exception) -> dict:
    """The failure; for a shape assertion (stock vLLM's, or the one patched vLLM turns into a
    ValueError) also what it compared."""
    assertion = error if isinstance(error, AssertionError) else error.__cause__
    if isinstance(assertion, AssertionError):
        return failure(error) | shape_assertion(error, assertion)
    return failure(error)


def run(storage: str, draft_quant_config: str | None) -> dict:
    options = {"draft_quant_config": draft_quant_config} if draft_quant_config else None
    with tempfile.TemporaryDirectory(prefix="mtpq-step3p5-") as checkpoint_dir:
        write_checkpoint(Path(checkpoint_dir), storage)
        return build_and_load(Path(checkpoint_dir), speculative_options=options, load_failure=load_failure)


def probe() -> dict:
    torch.manual_seed(0)
    has_option = has_draft_quant_config()
    runs = {
        name: run(storage, option) for name, (storage, option) in RUNS.items() if option is None or has_option
    }
    return {"hf_config": HF_CONFIG, "runs": runs}
