"""Probe section: the MTP drafts of the families users report 0 % acceptance for, on quantized
checkpoints whose MTP layer was left BF16.

For every family in FAMILIES and each of its formats (FORMATS) it writes a tiny checkpoint:
config.json with the family's architecture and the format's ``quantization_config`` (what the
release's quantizer writes for the main model), and a model.safetensors with every tensor the draft
loads, all BF16 with small random values, under the family's on-disk names (Qwen3.5: ``mtp.*`` beside
a VL config whose text model is in ``text_config``; GLM: ``model.layers.{num_hidden_layers}.*``). It
builds the draft as the proposer does and loads it through the engine's default loader
(mtp_vllm.build_and_load). Only CUDA-bound kernel choices are stood in for
(mtp_vllm.kernel_choice_stand_ins), and for the DeepSeek MLA that GLM-4.7-Flash and GLM-5 reuse, its
attention backend wrapper, which holds no weight.

GLM-5 (``GlmMoeDsaForCausalLM``, model_type glm_moe_dsa) is DeepSeek-V3.2's sparse-MLA architecture:
vLLM's CPU platform serves its MTP with the generic DeepSeekMTP (vllm/models/deepseek_v32/__init__.py),
CUDA with models/deepseek_v32/nvidia/mtp.py; both build the MTP layer from vllm_config.quant_config.
The CUDA drafter is not built here: its sparse-MLA attention needs an attention backend (the CPU
platform refuses sparse attention) and that backend's implementation object, more than a kernel
choice to stand in for.

Result: ``{family: {format: build_and_load(...)}}``.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.probes.mtp_vllm import build_and_load, failure, kernel_choice_stand_ins, mla_wrapper_stand_ins

HIDDEN = 128  # a multiple of every format's group or block (NVFP4 16, INT4 128, FP8 128x128)
INTERMEDIATE = 256
MOE_INTERMEDIATE = 128
VOCAB = 128
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 64
EXPERTS = 2


def _weights(prefix: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{name}.weight": shape for name, shape in shapes.items()}


def _norms(prefix: str, size: int, *names: str) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{name}.weight": (size,) for name in names}


def _mlp(prefix: str, intermediate: int) -> dict[str, tuple[int, ...]]:
    return _weights(
        prefix,
        {
            "gate_proj": (intermediate, HIDDEN),
            "up_proj": (intermediate, HIDDEN),
            "down_proj": (HIDDEN, intermediate),
        },
    )


def _moe(prefix: str) -> dict[str, tuple[int, ...]]:
    """Router, routed experts and one shared expert, DeepSeek-style names."""
    tensors = {f"{prefix}.gate.weight": (EXPERTS, HIDDEN)}
    for expert in range(EXPERTS):
        tensors |= _mlp(f"{prefix}.experts.{expert}", MOE_INTERMEDIATE)
    return tensors | _mlp(f"{prefix}.shared_experts", MOE_INTERMEDIATE)


def _deepseek_style_mtp_layer(layer: str) -> dict[str, tuple[int, ...]]:
    """What GLM-4.x and GLM-5 (like DeepSeek-V3) store around the MTP layer's decoder block."""
    return {
        f"{layer}.eh_proj.weight": (HIDDEN, 2 * HIDDEN),
        f"{layer}.shared_head.head.weight": (VOCAB, HIDDEN),
        **_norms(layer, HIDDEN, "enorm", "hnorm", "shared_head.norm"),
        **_norms(layer, HIDDEN, "input_layernorm", "post_attention_layernorm"),
    }


@dataclass(frozen=True)
class Family:
    # The vLLM module of the MTP drafter, imported first so a release that cannot import it says why.
    drafter_module: str
    hf_config: dict
    # Every tensor the draft loads, as the checkpoint names it: name -> shape (stored BF16).
    tensors: dict[str, tuple[int, ...]]
    formats: tuple[str, ...]
    # Stored float32 (routers' score-correction biases, indexer norms), as releases do.
    float32_tensors: tuple[str, ...] = ()
    # Multi-head latent attention, whose wrapper is stood in while the draft is built (CPU refuses it).
    mla: bool = False


QWEN3_5_MTP = "mtp.layers.0"
QWEN3_5 = Family(
    drafter_module="vllm.model_executor.models.qwen3_5_mtp",
    # Qwen3.5 (and the 3.6 / 3.8 releases) ship the multimodal config: the text model's fields,
    # mtp_num_hidden_layers included, are in text_config.
    hf_config={
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text",
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "mtp_num_hidden_layers": 1,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 2,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "vocab_size": VOCAB,
            "max_position_embeddings": 256,
            "torch_dtype": "bfloat16",
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "num_heads": 2,
            "intermediate_size": 64,
            "out_hidden_size": HIDDEN,
        },
        "torch_dtype": "bfloat16",
    },
    tensors={
        "model.language_model.embed_tokens.weight": (VOCAB, HIDDEN),
        "lm_head.weight": (VOCAB, HIDDEN),
        "mtp.fc.weight": (HIDDEN, 2 * HIDDEN),
        **_norms("mtp", HIDDEN, "norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"),
        # Gated attention: q_proj holds the query and its output gate.
        **_weights(
            f"{QWEN3_5_MTP}.self_attn",
            {
                "q_proj": (2 * HEADS * HEAD_DIM, HIDDEN),
                "k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
                "v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
                "o_proj": (HIDDEN, HEADS * HEAD_DIM),
            },
        ),
        **_norms(f"{QWEN3_5_MTP}.self_attn", HEAD_DIM, "q_norm", "k_norm"),
        **_mlp(f"{QWEN3_5_MTP}.mlp", INTERMEDIATE),
        **_norms(QWEN3_5_MTP, HIDDEN, "input_layernorm", "post_attention_layernorm"),
    },
    formats=("modelopt_nvfp4", "ct_nvfp4", "gptq_int4", "autoround_int4"),
)

GLM4_MTP = "model.layers.1"
GLM4_MOE = Family(
    drafter_module="vllm.model_executor.models.glm4_moe_mtp",
    # GLM-4.5 / 4.6 / 4.7: a MoE MTP layer with qk-norm and biased q/k/v.
    hf_config={
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "partial_rotary_factor": 0.5,
        "n_routed_experts": EXPERTS,
        "n_shared_experts": 1,
        "num_experts_per_tok": 1,
        "first_k_dense_replace": 0,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "use_qk_norm": True,
        "attention_bias": True,
        "vocab_size": VOCAB,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
    },
    tensors={
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        **_deepseek_style_mtp_layer(GLM4_MTP),
        **_weights(
            f"{GLM4_MTP}.self_attn",
            {
                "q_proj": (HEADS * HEAD_DIM, HIDDEN),
                "k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
                "v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
                "o_proj": (HIDDEN, HEADS * HEAD_DIM),
            },
        ),
        f"{GLM4_MTP}.self_attn.q_proj.bias": (HEADS * HEAD_DIM,),
        f"{GLM4_MTP}.self_attn.k_proj.bias": (KV_HEADS * HEAD_DIM,),
        f"{GLM4_MTP}.self_attn.v_proj.bias": (KV_HEADS * HEAD_DIM,),
        **_norms(f"{GLM4_MTP}.self_attn", HEAD_DIM, "q_norm", "k_norm"),
        **_moe(f"{GLM4_MTP}.mlp"),
        f"{GLM4_MTP}.mlp.gate.e_score_correction_bias": (EXPERTS,),
    },
    float32_tensors=("e_score_correction_bias",),
    formats=("ct_fp8", "fp8_block", "ct_mxfp4", "modelopt_nvfp4", "ct_nvfp4"),
)

MLA_Q_LORA = 128
MLA_KV_LORA = 128
MLA_NOPE = 64
MLA_ROPE = 64
MLA_V = 64
MLA_CONFIG = {
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "q_lora_rank": MLA_Q_LORA,
    "kv_lora_rank": MLA_KV_LORA,
    "qk_nope_head_dim": MLA_NOPE,
    "qk_rope_head_dim": MLA_ROPE,
    "v_head_dim": MLA_V,
    "head_dim": MLA_ROPE,
}
DEEPSEEK_MOE_CONFIG = {
    "moe_intermediate_size": MOE_INTERMEDIATE,
    "n_routed_experts": EXPERTS,
    "n_shared_experts": 1,
    "num_experts_per_tok": 1,
    "first_k_dense_replace": 0,
    "n_group": 1,
    "topk_group": 1,
}


def _mla_attention(prefix: str) -> dict[str, tuple[int, ...]]:
    """DeepSeek's multi-head latent attention, as checkpoints store it."""
    return {
        **_weights(
            prefix,
            {
                "q_a_proj": (MLA_Q_LORA, HIDDEN),
                "q_b_proj": (HEADS * (MLA_NOPE + MLA_ROPE), MLA_Q_LORA),
                "kv_a_proj_with_mqa": (MLA_KV_LORA + MLA_ROPE, HIDDEN),
                "kv_b_proj": (HEADS * (MLA_NOPE + MLA_V), MLA_KV_LORA),
                "o_proj": (HIDDEN, HEADS * MLA_V),
            },
        ),
        **_norms(prefix, MLA_Q_LORA, "q_a_layernorm"),
        **_norms(prefix, MLA_KV_LORA, "kv_a_layernorm"),
    }


GLM4_MOE_LITE_MTP = "model.layers.1"
GLM4_MOE_LITE = Family(
    # GLM-4.7-Flash: DeepSeek-style MLA and MoE.
    drafter_module="vllm.model_executor.models.glm4_moe_lite_mtp",
    hf_config={
        "architectures": ["Glm4MoeLiteForCausalLM"],
        "model_type": "glm4_moe_lite",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_nextn_predict_layers": 1,
        **MLA_CONFIG,
        **DEEPSEEK_MOE_CONFIG,
        "vocab_size": VOCAB,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
    },
    tensors={
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        **_deepseek_style_mtp_layer(GLM4_MOE_LITE_MTP),
        **_mla_attention(f"{GLM4_MOE_LITE_MTP}.self_attn"),
        **_moe(f"{GLM4_MOE_LITE_MTP}.mlp"),
        f"{GLM4_MOE_LITE_MTP}.mlp.gate.e_score_correction_bias": (EXPERTS,),
    },
    float32_tensors=("e_score_correction_bias",),
    formats=("fp8_block", "modelopt_nvfp4", "ct_nvfp4"),
    mla=True,
)

GLM5_MTP = "model.layers.1"
GLM5_INDEX_HEAD_DIM = 64
GLM5_INDEX_HEADS = 2
GLM5 = Family(
    # What the CPU platform serves glm_moe_dsa's MTP with (CUDA: models/deepseek_v32/nvidia/mtp.py).
    drafter_module="vllm.model_executor.models.deepseek_mtp",
    hf_config={
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_nextn_predict_layers": 1,
        **MLA_CONFIG,
        **DEEPSEEK_MOE_CONFIG,
        "index_topk": 4,
        "index_head_dim": GLM5_INDEX_HEAD_DIM,
        "index_n_heads": GLM5_INDEX_HEADS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
    },
    tensors={
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        **_deepseek_style_mtp_layer(GLM5_MTP),
        **_mla_attention(f"{GLM5_MTP}.self_attn"),
        # DeepSeek sparse attention's lightning indexer.
        **_weights(
            f"{GLM5_MTP}.self_attn.indexer",
            {
                "wq_b": (GLM5_INDEX_HEADS * GLM5_INDEX_HEAD_DIM, MLA_Q_LORA),
                "wk": (GLM5_INDEX_HEAD_DIM, HIDDEN),
                "weights_proj": (GLM5_INDEX_HEADS, HIDDEN),
            },
        ),
        f"{GLM5_MTP}.self_attn.indexer.k_norm.weight": (GLM5_INDEX_HEAD_DIM,),
        f"{GLM5_MTP}.self_attn.indexer.k_norm.bias": (GLM5_INDEX_HEAD_DIM,),
        **_moe(f"{GLM5_MTP}.mlp"),
    },
    float32_tensors=("indexer.k_norm",),
    formats=("fp8_block", "modelopt_nvfp4", "ct_nvfp4"),
    mla=True,
)

FAMILIES = {"qwen3_5": QWEN3_5, "glm4_moe": GLM4_MOE, "glm4_moe_lite": GLM4_MOE_LITE, "glm5": GLM5}


def _ct_group(weights: dict, activations: dict | None = None) -> dict:
    group = {"targets": ["Linear"], "weights": weights}
    if activations is not None:
        group["input_activations"] = activations
    return {"group_0": group}


_NVFP4_ARGS = {
    "num_bits": 4,
    "type": "float",
    "symmetric": True,
    "strategy": "tensor_group",
    "group_size": 16,
}
_MXFP4_ARGS = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32}
# The main model's quantization_config as each release's quantizer writes it (lm_head left out).
FORMATS = {
    # NVIDIA ModelOpt NVFP4 (config.json's "ignore" is hf_quant_config.json's exclude_modules).
    "modelopt_nvfp4": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "ignore": ["lm_head"],
        "producer": {"name": "modelopt", "version": "0.31.0"},
    },
    # llm-compressor NVFP4 (W4A4, FP8 group scales and a global scale).
    "ct_nvfp4": {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "ignore": ["lm_head"],
        "config_groups": _ct_group({**_NVFP4_ARGS, "dynamic": False}, {**_NVFP4_ARGS, "dynamic": "local"}),
    },
    # llm-compressor MXFP4 (W4A4, E8M0 group scales).
    "ct_mxfp4": {
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "ignore": ["lm_head"],
        "config_groups": _ct_group({**_MXFP4_ARGS, "dynamic": False}, {**_MXFP4_ARGS, "dynamic": True}),
    },
    # GPTQModel INT4.
    "gptq_int4": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "desc_act": False,
        "sym": True,
        "checkpoint_format": "gptq",
    },
    # Intel AutoRound INT4 in its GPTQ packing.
    "autoround_int4": {
        "quant_method": "auto-round",
        "bits": 4,
        "group_size": 128,
        "sym": True,
        "data_type": "int",
        "packing_format": "auto_round:auto_gptq",
    },
    # llm-compressor FP8 dynamic: per-channel weights, per-token activations.
    "ct_fp8": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ["lm_head"],
        "config_groups": _ct_group(
            {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
            {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True},
        ),
    },
    # Block-scaled FP8 (128x128), the format of DeepSeek's and Z.ai's own FP8 releases.
    "fp8_block": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}


def write_checkpoint(checkpoint_dir: Path, family: Family, quantization_format: str, generator) -> None:
    hf_config = {**family.hf_config, "quantization_config": FORMATS[quantization_format]}
    (checkpoint_dir / "config.json").write_text(json.dumps(hf_config))
    tensors = {}
    for name, shape in family.tensors.items():
        tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        tensors[name] = tensor.float() if any(part in name for part in family.float32_tensors) else tensor
    save_file(tensors, checkpoint_dir / "model.safetensors")


def run(family: Family, quantization_format: str, generator) -> dict:
    try:
        importlib.import_module(family.drafter_module)
    except ImportError as error:
        return {"build": failure(error)}

    def stand_ins():
        return [*kernel_choice_stand_ins(), *(mla_wrapper_stand_ins() if family.mla else [])]

    with tempfile.TemporaryDirectory(prefix="mtpq-family-") as checkpoint_dir:
        write_checkpoint(Path(checkpoint_dir), family, quantization_format, generator)
        return build_and_load(Path(checkpoint_dir), stand_ins)


def probe() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        name: {
            quantization_format: run(family, quantization_format, generator)
            for quantization_format in family.formats
        }
        for name, family in FAMILIES.items()
    }
