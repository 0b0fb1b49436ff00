"""Engineered tiny Qwen3.5 checkpoints, dense and MoE, and Qwen3-Next ones, shaped like the released ones.

As in checkpoints.py, greedy decoding follows the token chain `t -> successor[t]` (embeddings,
residual stream, an lm_head scoring predecessors) and the MTP layer drafts it only through its own
Linear weights: `mtp.fc` rotates the token embedding and the MTP MLP (MoE: its shared expert and
routed experts together) undoes the rotation. The main decoder layers are Qwen3.5's hybrid stack, one
Gated DeltaNet (linear attention) layer and one gated full-attention layer (`layer_types`,
`full_attention_interval`), with random weights whose outputs stay small, so they run in the engine
without moving an argmax.

What is Qwen3.5's own: the multimodal config (`Qwen3_5ForConditionalGeneration` /
`Qwen3_5MoeForConditionalGeneration`, the text model's fields in `text_config`, a `vision_config`),
Gemma-style norms (scale 1 + weight, so a unit norm stores zeros), the text model's tensors under
`model.language_model.*` in `model.safetensors` and the BF16 MTP layer as `mtp.*` in
`model_mtp.safetensors`, an index mapping both. The vision tower has no tensors: the engine runs
these text-only (`limit_mm_per_prompt` 0), which builds no tower.

Quantized variants quantize the main layers' attention, GDN input/output projections and dense /
shared-expert MLPs with compressed-tensors; the GDN `in_proj_a` / `in_proj_b`, routed experts,
lm_head and the MTP layer stay BF16.

Qwen3-Next (`qwen3_next`), the hybrid Qwen3.5 grew from, differs in: a flat config
(`Qwen3NextForCausalLM`, no vision), the MTP layer count as `num_nextn_predict_layers`, the text
model's tensors under `model.*`, every layer MoE, and the GDN input projections fused as stored
(`in_proj_qkvz`, `in_proj_ba`). Its MTP tensors are Qwen3.5's (`mtp.fc`, `mtp.layers.0`, ...).

Intern-S2-Mobius (`interns2_mobius`) is Qwen3.5-MoE's layout but for its decoder layers' routed experts:
they sit in banks the layers share (`model.language_model.meta_mlp.{b}`, the router beside them), each
layer keeping its shared expert. Its MTP layer is Qwen3.5-MoE's, with experts of its own
(`mtp_num_experts`, fewer here than a bank holds). Its config class is remote code, stood in for.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.checkpoints import (
    EOS_TOKEN_ID,
    HIDDEN_SIZE,
    MAIN_SUBLAYER_GAIN,
    MAX_POSITION_EMBEDDINGS,
    MTP_ATTENTION_GAIN,
    MTP_DECOY_RATIO,
    MTP_MLP_GAIN,
    NUM_EXPERTS,
    NUM_EXPERTS_PER_TOKEN,
    QUANT_FORMATS,
    RMS_NORM_EPS,
    ROPE_THETA,
    SUCCESSOR_FILE,
    VISION_TOWER_IGNORE,
    VOCAB_SIZE,
    _compress_linears,
    _linear_swiglu,
    _random_mlp,
    _random_rotation,
    _write_tokenizer,
    chain_embeddings,
    damage_tensor,
)

FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "interns2_mobius")
MOE_FAMILIES = ("qwen3_5_moe", "qwen3_next", "interns2_mobius")
# Families whose decoder layers route to banks of experts shared across layers (meta_mlp), each layer
# keeping a shared expert of its own; their MTP layer is Qwen3.5-MoE's, with experts of its own.
META_MOE_FAMILIES = ("interns2_mobius",)
# Families whose config is flat (no text_config, no vision tower).
FLAT_CONFIG_FAMILIES = ("qwen3_next",)
MTP_FILE = "model_mtp.safetensors"
MAIN_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# The text_config keys quantizers drop with the MTP layer (seed 000: NuExtract3-FP8 / -W4A16).
MTP_CONFIG_KEYS = ("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings")
QWEN3_NEXT_MTP_CONFIG_KEYS = ("num_nextn_predict_layers",)
# Bad input an export can carry beside its MTP layer: the config declaring one MTP layer more than
# model_mtp.safetensors holds, an index naming a model_mtp.safetensors the directory lacks,
# model_mtp.safetensors without the config's MTP keys, and the bad layouts every family gets
# (checkpoints.DAMAGES): an MTP tensor missing or of a wrong shape.
DAMAGES = (
    "mtp-layers-overdeclared",
    "mtp-file-missing",
    "mtp-keys-missing",
    "mtp-tensor-missing",
    "mtp-tensor-wrong-shape",
)

LAYER_TYPES = ("linear_attention", "full_attention")
MTP = "mtp"
MTP_LAYER = f"{MTP}.layers.0"
NUM_ATTENTION_HEADS = 4
NUM_KEY_VALUE_HEADS = 2
HEAD_DIM = 32
PARTIAL_ROTARY_FACTOR = 0.25
# Interleaved M-RoPE over the rotary half-dimensions (HEAD_DIM * 0.25 / 2 = 4), as the releases do.
MROPE_SECTION = [2, 1, 1]
# vLLM's CPU Gated DeltaNet kernel takes head dim 128 only (the releases' size).
LINEAR_KEY_HEADS, LINEAR_VALUE_HEADS, LINEAR_HEAD_DIM, CONV_KERNEL = 2, 2, 128, 4
INTERMEDIATE_SIZE = 2 * HIDDEN_SIZE
MOE_INTERMEDIATE_SIZE = HIDDEN_SIZE  # full rank: the MTP experts express a rotation
# Gemma-style norms scale by 1 + weight.
UNIT_NORM_WEIGHT = 0.0
# The shared expert's sigmoid gate reads the constant embedding coordinate (4.0): sigmoid(40) is 1.
SHARED_EXPERT_GATE_WEIGHT = 10.0


# Intern-S2-Mobius: one routed bank both decoder layers share, with more experts than the MTP layer has, so
# a draft sized by the trunk's expert count instead of mtp_num_experts would not load.
NUM_META_BLOCKS = 1
NUM_BANK_EXPERTS = 2 * NUM_EXPERTS
# Its config class is remote code (configuration_interns2_mobius.py in its releases): Qwen3.5-MoE's fields
# under its model type, text_config adding the bank count and the MTP layer's expert counts.
INTERNS2_MOBIUS_CONFIG_FILE = "configuration_interns2_mobius.py"
# The Qwen3.5 config class a family's (remote) config class extends.
_QWEN3_5_CONFIG_OF = {"interns2_mobius": "qwen3_5_moe"}
_CONFIGURATION_INTERNS2_MOBIUS = '''\
"""Intern-S2-Mobius configuration: Qwen3.5-MoE's fields under Intern-S2-Mobius's model type."""

from transformers import Qwen3_5MoeConfig


class InternS2MobiusConfig(Qwen3_5MoeConfig):
    model_type = "interns2_mobius"
'''


def text_config(family: str) -> dict:
    """The text model's config: Qwen3.5's text_config, or Qwen3-Next's whole (flat) config."""
    flat = family in FLAT_CONFIG_FAMILIES
    config = {
        "model_type": family if flat else f"{_QWEN3_5_CONFIG_OF.get(family, family)}_text",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": len(LAYER_TYPES),
        "layer_types": list(LAYER_TYPES),
        "full_attention_interval": len(LAYER_TYPES),
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_key_value_heads": NUM_KEY_VALUE_HEADS,
        "head_dim": HEAD_DIM,
        "attn_output_gate": True,
        "linear_num_key_heads": LINEAR_KEY_HEADS,
        "linear_num_value_heads": LINEAR_VALUE_HEADS,
        "linear_key_head_dim": LINEAR_HEAD_DIM,
        "linear_value_head_dim": LINEAR_HEAD_DIM,
        "linear_conv_kernel_dim": CONV_KERNEL,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
        },
        "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": EOS_TOKEN_ID,
    }
    if flat:
        config |= {"architectures": ["Qwen3NextForCausalLM"], "num_nextn_predict_layers": 1}
    else:
        config["rope_parameters"] |= {"mrope_section": MROPE_SECTION, "mrope_interleaved": True}
        config |= {"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False}
    if family in MOE_FAMILIES:
        config |= {
            "num_experts": NUM_EXPERTS,
            "num_experts_per_tok": NUM_EXPERTS_PER_TOKEN,
            "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
            "shared_expert_intermediate_size": MOE_INTERMEDIATE_SIZE,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    if family in META_MOE_FAMILIES:
        config |= {
            "num_experts": NUM_BANK_EXPERTS,
            "num_blocks": NUM_META_BLOCKS,
            "mtp_num_experts": NUM_EXPERTS,
            "mtp_num_experts_per_tok": NUM_EXPERTS_PER_TOKEN,
        }
    return config


def hf_config(family: str) -> dict:
    if family in FLAT_CONFIG_FAMILIES:
        return text_config(family)
    architecture = {
        "qwen3_5": "Qwen3_5ForConditionalGeneration",
        "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
        "interns2_mobius": "InternS2MobiusForConditionalGeneration",
    }
    remote_config = (
        {"auto_map": {"AutoConfig": f"{Path(INTERNS2_MOBIUS_CONFIG_FILE).stem}.InternS2MobiusConfig"}}
        if family in META_MOE_FAMILIES
        else {}
    )
    return {
        **remote_config,
        "architectures": [architecture[family]],
        "model_type": family,
        "text_config": text_config(family),
        # vLLM builds the config (and would build the tower) from it; text-only runs build no tower.
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "num_heads": 2,
            "intermediate_size": 64,
            "out_hidden_size": HIDDEN_SIZE,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [],
        },
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def mtp_config_keys(family: str) -> tuple[str, ...]:
    return QWEN3_NEXT_MTP_CONFIG_KEYS if family in FLAT_CONFIG_FAMILIES else MTP_CONFIG_KEYS


def _text_config_of(family: str, config: dict) -> dict:
    """Where a checkpoint's config.json holds the text model's keys."""
    return config if family in FLAT_CONFIG_FAMILIES else config["text_config"]


def _text_prefix(family: str) -> str:
    return "model" if family in FLAT_CONFIG_FAMILIES else "model.language_model"


def _layer(family: str, index: int) -> str:
    return f"{_text_prefix(family)}.layers.{index}"


def _gdn_projections(family: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The GDN input projections a quantizer quantizes, and the small ones it keeps BF16: Qwen3-Next
    stores them fused (q, k, v, z and b, a), Qwen3.5 split."""
    if family in FLAT_CONFIG_FAMILIES:
        return ("in_proj_qkvz",), ("in_proj_ba",)
    return ("in_proj_qkv", "in_proj_z"), ("in_proj_a", "in_proj_b")


def _attention_linears(layer: str) -> list[str]:
    return [f"{layer}.self_attn.{name}" for name in ("q_proj", "k_proj", "v_proj", "o_proj")]


def _mlp_linears(mlp: str) -> list[str]:
    return [f"{mlp}.{name}" for name in ("gate_proj", "up_proj", "down_proj")]


def _dense_mlp(family: str, layer: str) -> str:
    """The dense MLP, or the shared expert of an MoE layer."""
    return f"{layer}.mlp.shared_expert" if family in MOE_FAMILIES else f"{layer}.mlp"


def _routed_experts(family: str, layer: str) -> list[str]:
    """A layer's own routed experts: every MoE layer's, only the MTP layer's where banks are shared."""
    own = family in MOE_FAMILIES and (family not in META_MOE_FAMILIES or layer == MTP_LAYER)
    return [f"{layer}.mlp.experts.{e}" for e in range(NUM_EXPERTS)] if own else []


def _meta_banks(family: str) -> list[str]:
    if family not in META_MOE_FAMILIES:
        return []
    return [f"{_text_prefix(family)}.meta_mlp.{block}" for block in range(NUM_META_BLOCKS)]


def _bank_experts(family: str) -> list[str]:
    return [f"{bank}.experts.{e}" for bank in _meta_banks(family) for e in range(NUM_BANK_EXPERTS)]


def damaged_tensor(family: str) -> str:
    """The MTP tensor a damaged checkpoint lacks or holds in a wrong shape: the MTP MLP's output."""
    return f"{_mlp_linears(_dense_mlp(family, MTP_LAYER))[-1]}.weight"


def quantized_linears(family: str) -> list[str]:
    """The main layers' Linears a quantizer quantizes (GDN in_proj_a / in_proj_b stay BF16)."""
    names = []
    quantized, _ = _gdn_projections(family)
    for index, layer_type in enumerate(LAYER_TYPES):
        layer = _layer(family, index)
        if layer_type == "linear_attention":
            names += [f"{layer}.linear_attn.{name}" for name in (*quantized, "out_proj")]
        else:
            names += _attention_linears(layer)
        names += _mlp_linears(_dense_mlp(family, layer))
    return names


def mtp_linears(family: str) -> list[str]:
    """The MTP layer's Linears: what a quantizer that saw it would have quantized."""
    block = _attention_linears(MTP_LAYER) + _mlp_linears(_dense_mlp(family, MTP_LAYER))
    experts = [name for expert in _routed_experts(family, MTP_LAYER) for name in _mlp_linears(expert)]
    return [f"{MTP}.fc", *block, *experts]


def ignore_list(family: str, ignore_style: str) -> list[str]:
    """compressed-tensors `ignore`: "names" lists the BF16 MTP Linears, "unlisted" leaves them out.
    The vision tower is left out of quantization as the releases' quantizers do (vLLM builds it even
    for a text-only run, and its tiny Linears fit no W4A16 group)."""
    unquantized = ["lm_head"] if family in FLAT_CONFIG_FAMILIES else ["lm_head", VISION_TOWER_IGNORE]
    _, kept_bf16 = _gdn_projections(family)
    for index, layer_type in enumerate(LAYER_TYPES):
        layer = _layer(family, index)
        if layer_type == "linear_attention":
            unquantized += [f"{layer}.linear_attn.{name}" for name in kept_bf16]
        unquantized += [name for expert in _routed_experts(family, layer) for name in _mlp_linears(expert)]
    unquantized += [name for expert in _bank_experts(family) for name in _mlp_linears(expert)]
    return unquantized + (mtp_linears(family) if ignore_style == "names" else [])


def build_weights(family: str, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Float32 weights under checkpoint names, and the successor permutation."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    embed, lm_head, successor = chain_embeddings(generator)
    weights = {
        f"{_text_prefix(family)}.embed_tokens.weight": embed,
        f"{_text_prefix(family)}.norm.weight": _unit_norm(),
        "lm_head.weight": lm_head,
    }
    for index, layer_type in enumerate(LAYER_TYPES):
        weights |= _random_decoder_layer(family, _layer(family, index), layer_type, randn, MAIN_SUBLAYER_GAIN)
    for bank in _meta_banks(family):
        weights[f"{bank}.gate.weight"] = randn(NUM_BANK_EXPERTS, HIDDEN_SIZE) / math.sqrt(HIDDEN_SIZE)
    for expert in _bank_experts(family):
        weights |= _random_mlp(expert, MOE_INTERMEDIATE_SIZE, randn, MAIN_SUBLAYER_GAIN)

    # fc rotates the token embedding (the hidden state's half is unused); the MTP MLP undoes it.
    rotation = _random_rotation(randn)
    fc = torch.zeros(HIDDEN_SIZE, 2 * HIDDEN_SIZE)
    fc[:, :HIDDEN_SIZE] = rotation  # the MTP layer concatenates [embeddings, hidden states]
    weights |= {
        f"{MTP}.fc.weight": fc,
        f"{MTP}.pre_fc_norm_embedding.weight": _unit_norm(),
        f"{MTP}.pre_fc_norm_hidden.weight": _unit_norm(),
        f"{MTP}.norm.weight": _unit_norm(),
    }
    weights |= _random_decoder_layer(family, MTP_LAYER, "full_attention", randn, MTP_ATTENTION_GAIN)
    for name in [name for name in weights if name.startswith(f"{MTP_LAYER}.mlp.")]:
        del weights[name]  # the random MLP gives way to the engineered one
    weights |= _inverse_rotation_mlp(family, rotation, randn)
    return weights, successor


def _unit_norm(size: int = HIDDEN_SIZE) -> torch.Tensor:
    return torch.full((size,), UNIT_NORM_WEIGHT)


def _random_decoder_layer(family, layer, layer_type, randn, gain) -> dict[str, torch.Tensor]:
    """A decoder layer whose sublayers add ~gain of the residual's RMS."""
    hidden = HIDDEN_SIZE
    weights = {
        f"{layer}.input_layernorm.weight": _unit_norm(),
        f"{layer}.post_attention_layernorm.weight": _unit_norm(),
    }
    if layer_type == "linear_attention":
        key_dim, value_dim = LINEAR_KEY_HEADS * LINEAR_HEAD_DIM, LINEAR_VALUE_HEADS * LINEAR_HEAD_DIM
        gdn = f"{layer}.linear_attn"
        if family in FLAT_CONFIG_FAMILIES:
            projections = {"in_proj_qkvz": 2 * key_dim + 2 * value_dim, "in_proj_ba": 2 * LINEAR_VALUE_HEADS}
        else:
            projections = {
                "in_proj_qkv": 2 * key_dim + value_dim,
                "in_proj_z": value_dim,
                "in_proj_b": LINEAR_VALUE_HEADS,
                "in_proj_a": LINEAR_VALUE_HEADS,
            }
        weights |= {
            f"{gdn}.{name}.weight": randn(rows, hidden) / math.sqrt(hidden)
            for name, rows in projections.items()
        }
        weights |= {
            f"{gdn}.conv1d.weight": randn(2 * key_dim + value_dim, 1, CONV_KERNEL) / math.sqrt(CONV_KERNEL),
            f"{gdn}.A_log": torch.zeros(LINEAR_VALUE_HEADS),
            f"{gdn}.dt_bias": torch.ones(LINEAR_VALUE_HEADS),
            # The gated output norm scales by its weight (not 1 + weight).
            f"{gdn}.norm.weight": torch.ones(LINEAR_HEAD_DIM),
            f"{gdn}.out_proj.weight": randn(hidden, value_dim) * gain / math.sqrt(value_dim),
        }
    else:
        attention = f"{layer}.self_attn"
        heads = NUM_ATTENTION_HEADS * HEAD_DIM
        weights |= {
            # q_proj holds the query and its output gate.
            f"{attention}.q_proj.weight": randn(2 * heads, hidden) / math.sqrt(hidden),
            f"{attention}.k_proj.weight": randn(NUM_KEY_VALUE_HEADS * HEAD_DIM, hidden) / math.sqrt(hidden),
            f"{attention}.v_proj.weight": randn(NUM_KEY_VALUE_HEADS * HEAD_DIM, hidden) / math.sqrt(hidden),
            f"{attention}.o_proj.weight": randn(hidden, heads) * gain / math.sqrt(heads),
            f"{attention}.q_norm.weight": _unit_norm(HEAD_DIM),
            f"{attention}.k_norm.weight": _unit_norm(HEAD_DIM),
        }
    if family in MOE_FAMILIES:
        if _routed_experts(family, layer):
            weights[f"{layer}.mlp.gate.weight"] = randn(NUM_EXPERTS, hidden) / math.sqrt(hidden)
        weights[f"{layer}.mlp.shared_expert_gate.weight"] = _shared_expert_gate()
        for mlp in [_dense_mlp(family, layer), *_routed_experts(family, layer)]:
            weights |= _random_mlp(mlp, MOE_INTERMEDIATE_SIZE, randn, gain)
    else:
        weights |= _random_mlp(_dense_mlp(family, layer), INTERMEDIATE_SIZE, randn, gain)
    return weights


def _shared_expert_gate() -> torch.Tensor:
    gate = torch.zeros(1, HIDDEN_SIZE)
    gate[0, 0] = SHARED_EXPERT_GATE_WEIGHT
    return gate


def _inverse_rotation_mlp(family, rotation, randn) -> dict[str, torch.Tensor]:
    """The MTP MLP computing MTP_MLP_GAIN * rotation.T @ x. MoE: the shared expert adds a decoy
    MTP_DECOY_RATIO times larger that every routed expert subtracts (the renormalised routing
    weights sum to 1), so both expert paths are essential."""
    if family not in MOE_FAMILIES:
        return _linear_swiglu(_dense_mlp(family, MTP_LAYER), rotation.T, MTP_MLP_GAIN, INTERMEDIATE_SIZE)
    decoy = _random_rotation(randn)
    weights = {
        f"{MTP_LAYER}.mlp.gate.weight": randn(NUM_EXPERTS, HIDDEN_SIZE) / math.sqrt(HIDDEN_SIZE),
        f"{MTP_LAYER}.mlp.shared_expert_gate.weight": _shared_expert_gate(),
        **_linear_swiglu(
            _dense_mlp(family, MTP_LAYER),
            rotation.T + MTP_DECOY_RATIO * decoy,
            MTP_MLP_GAIN,
            MOE_INTERMEDIATE_SIZE,
        ),
    }
    for expert in _routed_experts(family, MTP_LAYER):
        weights |= _linear_swiglu(expert, -MTP_DECOY_RATIO * decoy, MTP_MLP_GAIN, MOE_INTERMEDIATE_SIZE)
    return weights


def fix_by_hand(bf16_dir: Path, export_dir: Path, out: Path) -> Path:
    """What seed 000's reporter did to a quantizer's export: copy the BF16 release's
    model_mtp.safetensors beside its files and add the MTP keys to text_config (no index to edit: the
    export is one file)."""
    shutil.copytree(export_dir, out)
    shutil.copy2(bf16_dir / MTP_FILE, out / MTP_FILE)
    config = json.loads((out / "config.json").read_text())
    bf16_text = json.loads((bf16_dir / "config.json").read_text())["text_config"]
    config["text_config"] |= {key: bf16_text[key] for key in MTP_CONFIG_KEYS}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return out


def make_qwen3_5_checkpoint(
    family: str,
    out_dir: str | Path,
    quant: str = "bf16",
    *,
    ignore_style: str = "names",
    drop_mtp: bool = False,
    damage: str | None = None,
    seed: int = 0,
) -> Path:
    """Write an engineered checkpoint of one of FAMILIES.

    ignore_style "names" lists the BF16 MTP Linears in `ignore` under their checkpoint names;
    "unlisted" leaves them out, as a quantizer that never saw them writes. drop_mtp: what such a
    quantizer exports (seed 000): no model_mtp.safetensors and no MTP keys in text_config (and, one
    file left, no index). damage: one of DAMAGES, done to a checkpoint that keeps its MTP layer.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if quant not in QUANT_FORMATS:
        raise ValueError(f"quant must be one of {QUANT_FORMATS}, got {quant!r}")
    if drop_mtp and (quant == "bf16" or ignore_style != "unlisted"):
        raise ValueError('drop_mtp needs a quantized format and ignore_style="unlisted"')
    if damage is not None and (damage not in DAMAGES or drop_mtp):
        raise ValueError(f"damage must be one of {DAMAGES}, on a checkpoint without drop_mtp; got {damage!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    weights, successor = build_weights(family, seed)
    tensors = {name: value.to(torch.bfloat16) for name, value in weights.items()}
    config = hf_config(family)
    if quant != "bf16":
        tensors, config["quantization_config"] = _compress_linears(
            tensors, quantized_linears(family), quant, ignore_list(family, ignore_style)
        )
    damage_tensor(tensors, damaged_tensor(family), damage)
    files = {MAIN_FILE: {n: t for n, t in tensors.items() if not n.startswith(f"{MTP}.")}}
    text = _text_config_of(family, config)
    if drop_mtp or damage == "mtp-keys-missing":
        for key in mtp_config_keys(family):
            del text[key]
    if damage == "mtp-layers-overdeclared":
        text[mtp_config_keys(family)[0]] += 1
    if not drop_mtp:
        files[MTP_FILE] = {n: t for n, t in tensors.items() if n.startswith(f"{MTP}.")}
    for file, contents in files.items():
        save_file({n: t.contiguous() for n, t in contents.items()}, out / file, metadata={"format": "pt"})
    if len(files) > 1:  # as save_pretrained: an index for several files only
        weight_map = {name: file for file, contents in files.items() for name in contents}
        total = sum(t.numel() * t.element_size() for contents in files.values() for t in contents.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
    if damage == "mtp-file-missing":
        (out / MTP_FILE).unlink()
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if family in META_MOE_FAMILIES:
        (out / INTERNS2_MOBIUS_CONFIG_FILE).write_text(_CONFIGURATION_INTERNS2_MOBIUS)
    (out / SUCCESSOR_FILE).write_text(json.dumps(successor.tolist()))
    _write_tokenizer(out)
    return out
