"""Probe section: the quant method each linear of an MTP draft is built with, per checkpoint layout.

For every architecture in CONSTRUCTION_ONLY and every scenario in SCENARIOS it writes a tiny checkpoint:
config.json with a compressed-tensors quantization_config (the main model's: INT8 W8A8, FP8 block for
DeepSeek-V4), and a model.safetensors holding the MTP layer's tensors in the scenario's format (BF16,
quantized, or quantized projections around a BF16 decoder block); only its header is read. It then
builds the draft as the proposer does (mtp_vllm.build_mtp_draft). Only CUDA-bound pieces are stood in
for; each architecture names its own.

Result: ``{architecture: {scenario: {"draft_quant_decision": ..., "linears": {module name: quant
method class name}}}}``, with ``{"error_type": ..., "error": ...}`` for a scenario whose construction
raised.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.probes.mtp_vllm import (
    CT_FP8_BLOCK_GROUP,
    INT8_W8A8_QUANTIZATION_CONFIG,
    build_mtp_draft,
    deepseek_v4_stand_ins,
    describe_linears,
    draft_quant_decision,
    failure,
    mla_wrapper_stand_ins,
)

# Every checkpoint here keeps its routed experts in BF16 and ignores them, as quantizers often do:
# the scenarios are about the MTP layer's linears. Shared experts stay quantizable, and the MoE
# blocks themselves stay: real MTP layers have them.
ROUTED_EXPERTS_IGNORE = r"re:.*\.experts\..*"


@dataclass(frozen=True)
class ProbedArchitecture:
    """A tiny checkpoint of one MTP architecture; module names are the checkpoint's."""

    hf_config: dict
    # Linears a quantizer quantizes: the MTP layer's own projections, and its decoder block's.
    projections: tuple[str, ...]
    block: tuple[str, ...]
    # MTP modules every scenario stores in BF16 (routed experts, routers, heads).
    always_bf16: tuple[str, ...] = ()
    # CUDA-bound pieces replaced while the draft is built.
    stand_ins: Callable[[], list] = list
    # The main model's quantization (its ignore list is added), and how a quantized MTP tensor is stored.
    quantization_config: dict = field(default_factory=lambda: INT8_W8A8_QUANTIZATION_CONFIG)
    quantized_weight_dtype: torch.dtype = torch.int8
    cache_dtype: str | None = None


def _names(prefix: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{name}" for name in names)


def _experts(prefix: str, count: int, *weights: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{expert}.{weight}" for expert in range(count) for weight in weights)


MLP = ("gate_proj", "up_proj", "down_proj")


# MTP drafters that cannot run end to end on CPU (Qwen3.5, GLM-4.x and GLM-5 are in mtp_families).
CONSTRUCTION_ONLY = {
    # Every width a multiple of 128: FP8 128x128 blocks fit every linear.
    "deepseek_v4": ProbedArchitecture(
        hf_config={
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "hidden_size": 128,
            "num_hidden_layers": 2,
            "num_nextn_predict_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 128,
            "qk_rope_head_dim": 64,
            "q_lora_rank": 128,
            "o_lora_rank": 128,
            "o_groups": 2,
            "sliding_window": 16,
            "compress_ratios": [0, 0, 0],
            "compress_rope_theta": 10000.0,
            "rope_theta": 10000.0,
            "rope_parameters": {"rope_type": "default"},
            "vocab_size": 128,
            "rms_norm_eps": 1e-6,
            "hc_eps": 1e-6,
            "hc_mult": 2,
            "hc_sinkhorn_iters": 2,
            "index_topk": 4,
            "n_routed_experts": 2,
            "n_shared_experts": 1,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 128,
            "num_hash_layers": 0,
            "swiglu_limit": 7.0,
            "norm_topk_prob": True,
            "hidden_act": "silu",
            "max_position_embeddings": 256,
            "torch_dtype": "bfloat16",
        },
        projections=_names("mtp.0", "e_proj", "h_proj"),
        block=(
            *_names("mtp.0.attn", "wq_a", "wq_b", "wkv", "wo_a", "wo_b"),
            *_names("mtp.0.ffn.shared_experts", "w1", "w2", "w3"),
        ),
        always_bf16=(
            "mtp.0.ffn.gate",
            "mtp.0.head",
            *_experts("mtp.0.ffn.experts", 2, "w1", "w2", "w3"),
        ),
        stand_ins=deepseek_v4_stand_ins,
        # DeepSeek-V4's o_proj takes an FP8 or a BF16 wo_a (the v0.22.1 series refuses others at
        # build). DeepseekV4Attention reads scale_fmt from the checkpoint's quantization_config.
        quantization_config={
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"linears": CT_FP8_BLOCK_GROUP},
            "scale_fmt": None,
        },
        quantized_weight_dtype=torch.float8_e4m3fn,
        # Its CUDA attention supports FP8 KV caches only.
        cache_dtype="fp8",
    ),
    "deepseek_v3": ProbedArchitecture(
        hf_config={
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_nextn_predict_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "n_shared_experts": 1,
            "n_routed_experts": 2,
            "num_experts_per_tok": 1,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 0,
            "q_lora_rank": 32,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16,
            "v_head_dim": 16,
            "vocab_size": 128,
            "max_position_embeddings": 256,
            "torch_dtype": "bfloat16",
        },
        projections=("model.layers.1.eh_proj",),
        block=(
            *_names(
                "model.layers.1.self_attn",
                "q_a_proj",
                "q_b_proj",
                "kv_a_proj_with_mqa",
                "kv_b_proj",
                "o_proj",
            ),
            *_names("model.layers.1.mlp.shared_experts", *MLP),
        ),
        always_bf16=(
            "model.layers.1.mlp.gate",
            "model.layers.1.shared_head.head",
            *_experts("model.layers.1.mlp.experts", 2, *MLP),
        ),
        stand_ins=mla_wrapper_stand_ins,
    ),
    "qwen3_next": ProbedArchitecture(
        hf_config={
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "num_nextn_predict_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 2,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "vocab_size": 128,
            "max_position_embeddings": 256,
            "torch_dtype": "bfloat16",
        },
        projections=("mtp.fc",),
        block=(
            *_names("mtp.layers.0.self_attn", "q_proj", "k_proj", "v_proj", "o_proj"),
            *_names("mtp.layers.0.mlp.shared_expert", *MLP),
        ),
        always_bf16=(
            "mtp.layers.0.mlp.gate",
            "mtp.layers.0.mlp.shared_expert_gate",
            *_experts("mtp.layers.0.mlp.experts", 2, *MLP),
        ),
    ),
    # Dense MTP block, as Step-3.5's is: only layers 1..N-1 (or moe_layers_enum) are MoE.
    "step3p5": ProbedArchitecture(
        hf_config={
            "architectures": ["Step3p5ForCausalLM"],
            "model_type": "step3p5",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_nextn_predict_layers": 1,
            "num_attention_heads": 2,
            "num_attention_groups": 1,
            "head_dim": 32,
            "vocab_size": 128,
            "max_position_embeddings": 256,
            "torch_dtype": "bfloat16",
        },
        projections=("model.layers.1.eh_proj",),
        block=(
            *_names("model.layers.1.self_attn", "q_proj", "k_proj", "v_proj", "o_proj"),
            *_names("model.layers.1.mlp", *MLP),
        ),
        always_bf16=("model.layers.1.shared_head.output",),
    ),
}

# How a checkpoint stores the MTP layer: scenario -> (projections quantized, block quantized).
SCENARIOS = {
    "bf16": (False, False),
    "quantized": (True, True),
    "bf16_block": (True, False),
}


def write_checkpoint(checkpoint_dir: Path, architecture: ProbedArchitecture, scenario: str) -> None:
    quantization_config = {**architecture.quantization_config, "ignore": ["lm_head", ROUTED_EXPERTS_IGNORE]}
    hf_config = {**architecture.hf_config, "quantization_config": quantization_config}
    (checkpoint_dir / "config.json").write_text(json.dumps(hf_config))
    projections_quantized, block_quantized = SCENARIOS[scenario]
    quantized = (architecture.projections if projections_quantized else ()) + (
        architecture.block if block_quantized else ()
    )
    # Tiny tensors: only the dtypes and names in the header are read.
    tensors = {}
    for module in architecture.projections + architecture.block + architecture.always_bf16:
        if module in quantized:
            tensors[f"{module}.weight"] = torch.zeros(2, 2).to(architecture.quantized_weight_dtype)
            tensors[f"{module}.weight_scale"] = torch.ones(2, 1, dtype=torch.float32)
        else:
            tensors[f"{module}.weight"] = torch.zeros(2, 2, dtype=torch.bfloat16)
    save_file(tensors, checkpoint_dir / "model.safetensors")


def build_draft_and_describe(checkpoint_dir: Path, architecture: ProbedArchitecture, scenario: str) -> dict:
    write_checkpoint(checkpoint_dir, architecture, scenario)
    draft, vllm_config = build_mtp_draft(
        checkpoint_dir, stand_ins=architecture.stand_ins(), cache_dtype=architecture.cache_dtype
    )
    return {"draft_quant_decision": draft_quant_decision(vllm_config), "linears": describe_linears(draft)}


def run_scenario(architecture: ProbedArchitecture, scenario: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="mtpq-construct-") as checkpoint_dir:
        try:
            return build_draft_and_describe(Path(checkpoint_dir), architecture, scenario)
        # Any construction failure is a finding to report, not a probe crash.
        except Exception as exc:  # noqa: BLE001
            return failure(exc)


def probe() -> dict:
    return {
        name: {scenario: run_scenario(architecture, scenario) for scenario in SCENARIOS}
        for name, architecture in CONSTRUCTION_ONLY.items()
    }
