"""Probe section: every MTP drafter of this vLLM's registry built on CPU as the proposer builds it, from
a tiny config of its target architecture quantized as a whole (compressed-tensors INT8 W8A8) whose MTP
layer is BF16 on disk.

The drafters and the target configs vLLM turns into each are read from this vLLM's own source
(mtpq.upstream.drafters, the registry and SpeculativeConfig.hf_config_override), never listed here.
Each target's config is its config class's (transformers' or vLLM's own; where it is remote code, an
importable class of the same fields registered under its model type: REMOTE_CONFIG_STAND_INS) with
its size attributes shrunk (SIZES; list attributes with one entry per layer cut to the new layer
count), plus the few fields an architecture needs besides (TARGET_OVERRIDES). The checkpoint holds one
BF16 MTP tensor: what the header survey of draft_quant_config="auto" reads (nothing is loaded). Only
what holds no weight and is bound to CUDA or refused by the CPU platform is stood in for: kernel and
unquantized MoE backend choices (mtp_vllm.kernel_choice_stand_ins, UNQUANTIZED_MOE_CHOICE), CUDA
streams, and the multi-head latent attention wrapper (the CPU platform refuses MLA, sparse MLA on 0.32).

Each built draft is then probed further: the on-disk namings of its MTP layer its own loader
accepts (``namings``), how vLLM's loader takes a checkpoint holding one MTP tensor, and that tensor
of a wrong shape (``bad_loads``), and the draft of a checkpoint whose MTP layer is FP8-block
quantized under a config group of its own (``own_scheme``).

Result: ``{drafter key: {"target": {"model_type", "architectures"}, "draft_quant_decision": ...,
"linears": {module: quant method}, "hidden_layers", "namings", "bad_loads", "own_scheme"}}``, or
``{"target": ..., "build": {"error_type", "error"}}`` when the draft cannot be built (``"config"``
instead of ``"build"``: no config of the target could be made).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import tempfile
from pathlib import Path
from unittest import mock

import torch
from safetensors.torch import save_file

from mtpq.upstream.drafters import Drafter, directory_reader, read_drafters
from tests.probes.mtp_vllm import (
    CT_FP8_BLOCK_GROUP,
    INT8_W8A8_QUANTIZATION_CONFIG,
    build_mtp_draft,
    cuda_stream_stand_ins,
    describe_linears,
    draft_quant_decision,
    failure,
    inspect_in_process,
    kernel_choice_stand_ins,
    load_mtp_draft_weights,
    mla_wrapper_stand_ins,
)

# Size attributes of config classes, shrunk so every drafter builds in well under a second. Widths
# are multiples of 16 (INT8 channels, head dims); one expert group.
SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    # as many KV heads as heads: some attentions (GLM-5-Next's, MiniMax-M3's indexer) require it
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "n_routed_experts": 4,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 0,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "num_attention_groups": 2,
    "moe_num_experts": 4,
    "moe_top_k": 2,
    "share_expert_dim": 32,
    "sparse_num_index_heads": 4,
    "index_n_heads": 2,
    "index_head_dim": 16,
}
# Set whether or not the class has them: one MTP layer under each field the drafters count them by, no
# dense layers before the MoE ones (DeepSeek-style drafters read it without a default).
ALWAYS = {
    "num_nextn_predict_layers": 1,
    "mtp_num_hidden_layers": 1,
    "first_k_dense_replace": 0,
}
# MiMo-V2's MTP layer is a sliding-window attention layer, sized by the swa_* fields (MiMo-V2-Omni's
# text model is MiMo-V2-Flash's).
MIMO_V2 = {
    "layernorm_epsilon": 1e-6,
    "swa_num_attention_heads": SIZES["num_attention_heads"],
    "swa_num_key_value_heads": SIZES["num_key_value_heads"],
    "swa_head_dim": SIZES["head_dim"],
}
# Target model types whose config class is remote code (not importable here): the importable class
# (a vLLM config class's name or a model type) that stands in, registered under the remote model type.
REMOTE_CONFIG_STAND_INS = {
    # vLLM's class of Ling V3's text config, which has this model type
    "bailing_hybrid": "BailingMoeV3TextConfig",
    # openPangu Ultra MoE is DeepSeek-V3's architecture
    "pangu_ultra_moe": "deepseek_v3",
    # Intern-S2-Mobius is a Qwen3.5-MoE whose MTP layer has experts of its own (set below)
    "interns2_mobius": "qwen3_5_moe",
}
# Fields a target needs besides its config class and the sizes: the config class a drafter's target
# borrows where its own is remote code (MiMo's is Qwen2 with an MTP layer count).
TARGET_OVERRIDES = {
    "MiMoMTPModel": {"model_type": "qwen2"},
    "MiMoV2MTPModel": MIMO_V2,
    "MiMoV2OmniMTPModel": {"model_type": "mimo_v2_flash", **MIMO_V2},
    # Ling V3's text config is Bailing's hybrid one (vLLM's class of it stands in for remote code); its
    # layer types left for the class to derive from the layer count.
    "BailingMoeV3MTPModel": {"model_type": "bailing_hybrid", "layer_types": None},
    "BailingMoeV25MTPModel": {"layer_types": None},
    "InternS2MobiusMTP": {
        "text_config": {
            "mtp_num_experts": SIZES["num_experts"],
            "mtp_num_experts_per_tok": SIZES["num_experts_per_tok"],
        }
    },
    # Its drafter reads the vocabulary size beside the nested text config.
    "Exaone4_5_MTP": {"vocab_size": SIZES["vocab_size"]},
    # Its config class has no default layer count; the MTP survey reads it.
    "DeepSeekV4MTPModel": {"num_hidden_layers": SIZES["num_hidden_layers"]},
    "LongCatFlashMTPModel": {"mla_scale_q_lora": True, "mla_scale_kv_lora": True},
    "HYV3MTPModel": {"expert_hidden_dim": SIZES["moe_intermediate_size"], "route_norm": True},
    # Their MLA is NoPE-only; GLM-5-Next's text config leaves that, mHC's switch, the indexer's RoPE
    # layout and the router's fields to remote code.
    "Glm5NextMTPModel": {
        "text_config": {
            "mhc": False,
            "mla_use_nope": True,
            "indexer_rope_interleave": False,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
        }
    },
    "KimiK3MTPModel": {"text_config": {"mla_use_nope": True}},
    "InklingMTPModel": {"mtp_config": {"num_nextn_predict_layers": 1}},
    # vLLM 0.22.1 reads the releases' per-layer MoE flags (exaone_moe.py:201): transformers' class has none.
    "ExaoneMoeMTP": {"is_moe_layer": [True] * SIZES["num_hidden_layers"]},
}
# Prefix caching off from the start: the CPU platform turns it off for MLA models after the hybrid
# ones (GLM-5-Next, Kimi-K3) sized their mamba blocks for it, which VllmConfig then refuses.
CACHE_OPTIONS = {"enable_prefix_caching": False}
# The unquantized MoE backend choice: the CPU platform's only backend refuses some experts (MiniMax-M3's).
UNQUANTIZED_MOE_CHOICE = (
    "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method.select_unquantized_moe_backend"
)
# What the header survey reads: one BF16 linear weight under an MTP prefix.
MTP_TENSOR = "mtp.layers.0.self_attn.o_proj.weight"
# Where checkpoints may put an MTP layer's tensors: each prefix followed by a layer index (0, the
# target's hidden layer count, or the draft's own index). A decoder-layer prefix under the hidden
# layer count names the target's own layers, never an MTP one.
DECODER_LAYER_PREFIXES = ("model.layers.", "model.language_model.layers.", "language_model.model.layers.")
MTP_LAYER_PREFIXES = (
    "mtp.layers.",
    "mtp.",
    "model.mtp.layers.",
    "model.mtp.",
    "model.mtp_layers.",
    "mtp_layers.",
)
# Draft parameters whose naming is tried: one of the MTP block (attention output, else MLP output)
# and its glue (the projection of the concatenated embedding and hidden state, or of each).
NAMED_PARAMETERS = {
    "block": (".o_proj.weight", ".down_proj.weight"),
    "glue": (".eh_proj.weight", ".fc.weight", ".input_proj.weight", ".fc_embedding.weight"),
    # Qwen4-exp projects the hidden state apart from the embedding
    "hidden_glue": (".fc_hidden.weight",),
}
# The MTP layer in a scheme of its own: compressed-tensors FP8 blocks (as official FP8 releases store
# MTP) beside the target's INT8, its targets naming the MTP layer as the checkpoint does. Blocks of 16
# divide every width of the tiny configs.
FP8_BLOCK_16 = {
    **CT_FP8_BLOCK_GROUP,
    "weights": {**CT_FP8_BLOCK_GROUP["weights"], "block_structure": [16, 16]},
    "input_activations": {**CT_FP8_BLOCK_GROUP["input_activations"], "group_size": 16},
}
# The target's INT8 W8A8 group, and a W4A16 one (groups of 16 divide every width of the tiny configs).
INT8_GROUP = {
    **INT8_W8A8_QUANTIZATION_CONFIG["config_groups"]["group_0"],
    "format": INT8_W8A8_QUANTIZATION_CONFIG["format"],
}
W4A16_GROUP = {
    "format": "pack-quantized",
    "targets": ["Linear"],
    "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 16},
}


def _config_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    if model_type in REMOTE_CONFIG_STAND_INS:
        return _stand_in_config_class(model_type)
    if model_type in _CONFIG_REGISTRY:
        return _CONFIG_REGISTRY[model_type]
    return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None


@functools.cache
def _stand_in_config_class(model_type: str):
    """REMOTE_CONFIG_STAND_INS' class for a model type, registered with transformers under it (None
    where this vLLM or transformers has no such class)."""
    from transformers import AutoConfig
    from vllm.transformers_utils import configs

    name = REMOTE_CONFIG_STAND_INS[model_type]
    base = getattr(configs, name, None) if name[0].isupper() else _config_class(name)
    if base is None:
        return None
    # A class of that model type is registered as it is: a subclass of vLLM's BailingMoeV3TextConfig
    # loses the fields its __init__ sets.
    stand_in = base
    if base.model_type != model_type:
        stand_in = type(base.__name__, (base,), {"model_type": model_type})
    AutoConfig.register(model_type, stand_in, exist_ok=True)
    return stand_in


def _architecture_names(model_type: str) -> list[str]:
    """transformers' model class names for a model_type (causal LM first)."""
    from transformers.models.auto import modeling_auto

    mappings = (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )
    return [mapping[model_type] for mapping in mappings if model_type in mapping]


def _model_type_of(architecture: str) -> str | None:
    from transformers.models.auto import modeling_auto

    for mapping in (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    ):
        for model_type, name in mapping.items():
            if name == architecture:
                return model_type
    return None


def _targets(drafter: Drafter) -> list[tuple[str, str]]:
    """(model_type, architecture) pairs of the target configs vLLM turns into this drafter: an
    architecture vLLM's registry serves, with a config class transformers or vLLM has."""
    from vllm.model_executor.models.registry import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    override = TARGET_OVERRIDES.get(drafter.key, {})
    model_types = [name for name in drafter.targets if _config_class(name) is not None]
    pairs = []
    for architecture in (name for name in drafter.targets if name in supported):
        model_type = (
            override.get("model_type") or _model_type_of(architecture) or next(iter(model_types), None)
        )
        if model_type is not None and _config_class(model_type) is not None:
            pairs.append((model_type, architecture))
    for model_type in model_types:
        lowered = model_type.replace("_", "")
        candidates = _architecture_names(model_type) + sorted(
            name for name in supported if name.lower().startswith(lowered + "for")
        )
        # The first vLLM serves: vLLM 0.22.1 spells transformers' ExaoneMoeForCausalLM ExaoneMoEForCausalLM.
        pairs += [(model_type, name) for name in candidates if name in supported][:1]
    if not pairs:
        raise LookupError(
            f"no target of {drafter.key} ({', '.join(drafter.targets)}) has a config class in "
            "transformers or vLLM and an architecture vLLM serves"
        )
    return pairs


def _shrunk(values: dict) -> dict:
    """The SIZES a config dict sets (a head_dim if it has heads), its per-layer lists cut to the
    shrunk layer count, and ALWAYS; nested configs likewise."""
    # A size the class leaves 0 means the part is absent (GLM-5-Next's DSA layers have no RoPE dims).
    changes = {name: size for name, size in SIZES.items() if values.get(name, 0) != 0} | ALWAYS
    if "num_attention_heads" in values:
        changes["head_dim"] = SIZES["head_dim"]
    layers = values.get("num_hidden_layers")
    if isinstance(layers, int) and "num_hidden_layers" in changes:
        for name, value in values.items():
            if isinstance(value, list) and len(value) == layers and layers != changes["num_hidden_layers"]:
                changes[name] = value[: changes["num_hidden_layers"]]
    for name, value in values.items():
        if name.endswith("_config") and isinstance(value, dict) and value:
            changes[name] = {**value, **_shrunk(value)}
    return changes


def _merged(values: dict, overrides: dict) -> dict:
    """``values`` with ``overrides`` set, a nested config's fields into that config."""
    merged = dict(values)
    for name, value in overrides.items():
        nested = isinstance(value, dict) and isinstance(values.get(name), dict)
        merged[name] = _merged(values[name], value) if nested else value
    return merged


def target_config(drafter: Drafter, model_type: str, architecture: str) -> dict:
    defaults = _config_class(model_type)().to_dict()
    return {
        **_merged(_shrunk(defaults), TARGET_OVERRIDES.get(drafter.key, {})),
        "model_type": model_type,
        "architectures": [architecture],
        "torch_dtype": "bfloat16",
    }


def _naming_candidates(parameter: str, hidden_layers: int) -> list[tuple[str, str]]:
    """(root, rest) pairs: on-disk names ``root + rest`` a draft parameter could be stored under. The
    rest is what follows the draft's layer root (or its first component), with or without the wrapper
    component the draft may add (DeepSeek-style drafters' ``mtp_block``)."""
    found = re.match(r"(.*?(?:layers|mtp_layers)\.([0-9]+)\.)(.*)", parameter)
    draft_index = int(found[2]) if found else 0
    rest = found[3] if found else parameter.partition(".")[2]
    rests = [rest] + ([rest.partition(".")[2]] if rest.count(".") >= 2 else [])
    indices = sorted({0, hidden_layers, draft_index})
    roots = [
        f"{prefix}{index}."
        for prefix in DECODER_LAYER_PREFIXES
        for index in indices
        if index >= hidden_layers
    ]
    roots += [f"{prefix}{index}." for prefix in MTP_LAYER_PREFIXES for index in indices]
    roots += [prefix for prefix in MTP_LAYER_PREFIXES if not prefix.endswith("layers.")]
    return [(root, rest) for root in roots for rest in rests]


def accepted_namings(draft: torch.nn.Module, hidden_layers: int) -> dict[str, list[list[str]]]:
    """Per named parameter (NAMED_PARAMETERS), the [root, rest] candidates the draft's own
    load_weights stores into it: the parameter takes the tensor's values (whatever the loader raises
    afterwards, as MTP loaders that check their layer got every weight do)."""
    parameters = dict(draft.named_parameters())
    namings = {}
    for role, endings in NAMED_PARAMETERS.items():
        name = next((n for ending in endings for n in parameters if n.endswith(ending)), None)
        if name is None:
            continue
        parameter = parameters[name]
        accepted = []
        for root, rest in _naming_candidates(name, hidden_layers):
            parameter.data.zero_()
            # A name the loader cannot map raises (KeyError) or is skipped: either way not accepted.
            with contextlib.suppress(Exception):
                draft.load_weights(iter([(root + rest, torch.ones(parameter.shape, dtype=torch.bfloat16))]))
            if bool((parameter.data == 1).all()):
                accepted.append([root, rest])
        namings[role] = {"parameter": name, "shape": list(parameter.shape), "accepted": accepted}
    return namings


def _failure_in(directory: Path, error: Exception) -> dict:
    """A failure as the row records it, the checkpoint's path written <checkpoint>."""
    found = failure(error)
    return {**found, "error": found["error"].replace(str(directory), "<checkpoint>")}


def _write_checkpoint(directory: Path, config: dict, quantization_config: dict, tensors: dict) -> None:
    (directory / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    save_file(tensors, directory / "model.safetensors")


def _loaded(draft, vllm_config, directory: Path, tensors: dict) -> dict:
    """The draft loaded from a checkpoint holding ``tensors`` as the engine loads it: ``{"unloaded":
    parameters its loader did not report}``, or the loader's error with the draft parameters and
    checkpoint tensors it names, and whether it names the drafter class."""
    save_file(tensors, directory / "model.safetensors")
    parameters = {name for name, _ in draft.named_parameters()}
    try:
        loaded = load_mtp_draft_weights(draft, vllm_config)
    except Exception as error:  # noqa: BLE001
        found = _failure_in(directory, error)
        return {
            **found,
            "names": sorted(name for name in parameters | tensors.keys() if name in found["error"]),
            "drafter_named": type(draft).__name__ in found["error"],
        }
    return {"unloaded": len(parameters - loaded)}


def bad_loads(draft, vllm_config, directory: Path, namings: dict) -> dict:
    """Two checkpoints the draft must refuse, naming the tensor: its block parameter's tensor alone
    (every other draft parameter missing), and that tensor 16 rows too many."""
    block = namings.get("block")
    if not block or not block["accepted"]:
        return {}
    name = "".join(block["accepted"][0])
    rows, *rest = block["shape"]
    return {
        "tensor": name,
        "missing": _loaded(
            draft, vllm_config, directory, {name: torch.ones(rows, *rest, dtype=torch.bfloat16)}
        ),
        "wrong_shape": _loaded(
            draft, vllm_config, directory, {name: torch.ones(rows + 16, *rest, dtype=torch.bfloat16)}
        ),
    }


def own_scheme_quantization(
    mtp_roots: list[str], target_group: dict = INT8_GROUP, mtp_group: dict = FP8_BLOCK_16
) -> dict:
    """The target's group on every Linear with a group of its own for the MTP layer, which the group's
    targets name as the checkpoint does (a name match wins over the target group's class match)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "mixed-precision",
        "config_groups": {
            "group_0": target_group,
            "mtp": {**mtp_group, "targets": [f"re:^{re.escape(root)}" for root in mtp_roots]},
        },
    }


def gptq_own_bits_quantization(mtp_roots: list[str]) -> dict:
    """A GPTQ INT8 target whose MTP layer is INT4: its blocks listed by the checkpoint's names in
    modules_in_block_to_quantize (what AutoRound writes as block_name_to_quantize), its bits in a
    dynamic rule."""
    return {
        "quant_method": "gptq",
        "bits": 8,
        "group_size": 32,
        "desc_act": False,
        "sym": True,
        "modules_in_block_to_quantize": mtp_roots,
        "dynamic": {f"+:{re.escape(root)}.*": {"bits": 4} for root in mtp_roots},
    }


def modelopt_fp8_beside_nvfp4_quantization(mtp_modules: list[str]) -> dict:
    """A ModelOpt NVFP4 target whose MTP layer is FP8 (nvidia/DeepSeek-V4-Pro-NVFP4's layout): mixed
    precision, every quantized module in its own quantized_layers entry under the checkpoint's name (a
    trunk one, which no draft builds, beside the MTP modules stored quantized)."""
    return {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "kv_cache_quant_algo": None,
        "ignore": ["lm_head"],
        "quantized_layers": {
            "model.layers.0.self_attn.o_proj": {"quant_algo": "NVFP4", "group_size": 16},
            **{module: {"quant_algo": "FP8"} for module in mtp_modules},
        },
    }


# The other scheme pairs (MTP layer / target, as drafters.OWN_SCHEME_MARKERS names them), each built
# with the series and stock: (its quantization config from the MTP roots and the MTP modules stored
# quantized, the tensors of an (rows, columns) MTP weight stored in the MTP layer's format, keyed by
# the weight's name without "weight").
OWN_SCHEME_PAIRS = {
    "W4A16 / INT8": (
        lambda roots, _: own_scheme_quantization(roots, INT8_GROUP, W4A16_GROUP),
        lambda rows, columns: {
            "weight_packed": torch.zeros(rows, columns // 8, dtype=torch.int32),
            "weight_scale": torch.ones(rows, columns // 16, dtype=torch.bfloat16),
            "weight_shape": torch.tensor([rows, columns]),
        },
    ),
    "INT8 / W4A16": (
        lambda roots, _: own_scheme_quantization(roots, W4A16_GROUP, INT8_GROUP),
        lambda rows, columns: {
            "weight": torch.zeros(rows, columns, dtype=torch.int8),
            "weight_scale": torch.ones(rows, 1),
        },
    ),
    # GPTQ packs 4-bit weights along the input (qweight) and zero points along the output (qzeros).
    "GPTQ INT4 / GPTQ INT8": (
        lambda roots, _: gptq_own_bits_quantization(roots),
        lambda rows, columns: {
            "qweight": torch.zeros(columns // 8, rows, dtype=torch.int32),
            "qzeros": torch.zeros(columns // 32, rows // 8, dtype=torch.int32),
            "scales": torch.ones(columns // 32, rows, dtype=torch.float16),
            "g_idx": torch.zeros(columns, dtype=torch.int32),
        },
    ),
    # ModelOpt FP8: per-tensor weight and input scales.
    "FP8 / NVFP4 ModelOpt": (
        lambda _, modules: modelopt_fp8_beside_nvfp4_quantization(modules),
        lambda rows, columns: {
            "weight": torch.zeros(rows, columns).to(torch.float8_e4m3fn),
            "weight_scale": torch.ones(()),
            "input_scale": torch.ones(()),
        },
    ),
}


def _scheme(module: torch.nn.Module) -> str:
    """A layer's compressed-tensors scheme or quant method, with GPTQ's bits (which dynamic rules set per
    layer), and a ModelOpt linear's weight dtype (vLLM 0.32's one ModelOpt linear method serves every
    format)."""
    name = type(getattr(module, "scheme", None) or module.quant_method).__name__
    bits = getattr(getattr(module.quant_method, "quant_config", None), "weight_bits", None)
    if "GPTQ" in name and bits:
        return f"{name} int{bits}"
    # A linear's weight, or a MoE layer's fused expert weights.
    weight = getattr(module, "weight", getattr(module, "w13_weight", None))
    if name.startswith("ModelOpt") and isinstance(weight, torch.Tensor):
        return f"{name} {str(weight.dtype).removeprefix('torch.')}"
    return name


def describe_schemes(draft: torch.nn.Module) -> dict[str, str]:
    """The compressed-tensors scheme of every linear that has one, GPTQ and ModelOpt linears' methods,
    and the quantized MoE layers' quant methods (a MoE layer a ModelOpt mixed-precision config has no
    entry for is built unquantized, as its linears are)."""

    def quantized(module: torch.nn.Module) -> bool:
        method = type(getattr(module, "quant_method", None)).__name__
        kinds = ("MoEMethod", "GPTQ", "ModelOpt")
        return not method.startswith("Unquantized") and any(kind in method for kind in kinds)

    return {
        name: _scheme(module)
        for name, module in draft.named_modules()
        if getattr(module, "scheme", None) is not None or quantized(module)
    }


def _build(drafter: Drafter, directory: Path, architecture: str):
    """(draft, vllm_config, whether its attention is multi-head latent attention, which the CPU
    platform does not run: its wrapper stood in)."""
    inspect_in_process(architecture, drafter.key)
    mla_wrapper = mock.MagicMock()
    stand_ins = [
        *kernel_choice_stand_ins(),
        *cuda_stream_stand_ins(),
        *mla_wrapper_stand_ins(mla_wrapper),
        mock.patch(UNQUANTIZED_MOE_CHOICE, return_value=(mock.MagicMock(), mock.MagicMock())),
    ]
    draft, vllm_config = build_mtp_draft(directory, stand_ins, cache_options=CACHE_OPTIONS)
    return draft, vllm_config, mla_wrapper.called


def checkpoint_naming(naming: dict) -> tuple[str, str]:
    """The (root, rest) checkpoints store a draft parameter under: of the namings its loader accepts, the
    first without the draft's wrapper component (model.layers.{N}.self_attn..., not
    model.layers.{N}.mtp_block.self_attn...) where it takes both."""
    return min(naming["accepted"], key=lambda accepted: len(accepted[1]))


def checkpoint_linears(namings: dict, linears: dict[str, str], packed: dict[str, list[str]]) -> list[str]:
    """The MTP layer's linears as a checkpoint names them: every linear the draft builds under its
    block's prefix, that prefix replaced by the block's checkpoint root and a fused linear by its shards
    (the draft's packed_modules_mapping); the glue module as its checkpoint naming."""
    found = []
    for role, naming in namings.items():
        if not naming["accepted"]:
            continue
        root, rest = checkpoint_naming(naming)
        if role != "block":
            found.append(root + rest.removesuffix(".weight"))
            continue
        draft_prefix = naming["parameter"].removesuffix(rest)
        for name, method in linears.items():
            # Whatever the base draft built them as (stock vLLM: the target's quantization).
            if name.startswith(draft_prefix) and method.endswith("LinearMethod"):
                parent, _, leaf = (root + name.removeprefix(draft_prefix)).rpartition(".")
                found += [f"{parent}.{shard}" for shard in packed.get(leaf, [leaf])]
    return sorted(set(found))


def own_scheme(drafter: Drafter, config: dict, architecture: str, namings: dict, modules: list[str]) -> dict:
    """The draft of a checkpoint whose MTP layer is FP8-block quantized under a group of its own (as the
    checkpoint names them: the block's root, and the glue module, Qwen3.5's "mtp.fc"), and how it
    loads that layer's FP8 weight and block scales for its block parameter. ``modules``: the MTP
    layer's linears as the checkpoint names them, for configs with an entry per module."""
    roots = sorted(
        root if role == "block" else root + rest.removesuffix(".weight")
        for role, naming in namings.items()
        if naming["accepted"]
        for root, rest in naming["accepted"][:1]
    )
    block = namings.get("block", {})
    if not roots or not block.get("accepted"):
        return {}
    quantization = own_scheme_quantization(roots)
    weight = "".join(block["accepted"][0])
    rows, columns = block["shape"]
    fp8_tensors = {
        weight: torch.zeros(rows, columns).to(torch.float8_e4m3fn),
        weight.removesuffix("weight") + "weight_scale": torch.ones(-(-rows // 16), -(-columns // 16)),
    }

    def own_scheme_built(draft, vllm_config, directory: Path) -> dict:
        return {
            "targets": quantization["config_groups"]["mtp"]["targets"],
            "draft_quant_decision": draft_quant_decision(vllm_config),
            "schemes": describe_schemes(draft),
            "load": _loaded(draft, vllm_config, directory, fp8_tensors),
        }

    found = _built_draft(drafter, config, architecture, quantization, fp8_tensors, own_scheme_built)
    if "build" not in found:
        # The other pairs: built only (their MTP tensors stored quantized, `auto` keeps the checkpoint's
        # quantization), nothing loaded.
        base = "".join(checkpoint_naming(block)).removesuffix("weight")
        found["pairs"] = {
            pair: _built_draft(
                drafter,
                config,
                architecture,
                quantization_for(roots, modules),
                {base + key: value for key, value in stored(rows, columns).items()},
                lambda draft, *_: {"schemes": describe_schemes(draft)},
            )
            for pair, (quantization_for, stored) in OWN_SCHEME_PAIRS.items()
        }
    return found


def _built_draft(
    drafter: Drafter, config: dict, architecture: str, quantization: dict, tensors: dict, describe
) -> dict:
    """``describe(draft, vllm_config, checkpoint directory)`` of the draft of a checkpoint quantized as
    ``quantization`` holding ``tensors``, or why it was not built."""
    with tempfile.TemporaryDirectory(prefix="mtpq-drafter-") as checkpoint_dir:
        directory = Path(checkpoint_dir)
        _write_checkpoint(directory, config, quantization, tensors)
        try:
            draft, vllm_config, _ = _build(drafter, directory, architecture)
        except Exception as error:  # noqa: BLE001
            return {"build": _failure_in(directory, error)}
        return describe(draft, vllm_config, directory)


def build(drafter: Drafter, model_type: str, architecture: str) -> dict:
    """The draft of one target built, or why not (the checkpoint's path in the error as <checkpoint>);
    the namings its loader accepts, how it loads bad checkpoints, and its build under an MTP scheme of
    its own."""
    result = {"target": {"model_type": model_type, "architectures": [architecture]}}
    with tempfile.TemporaryDirectory(prefix="mtpq-drafter-") as checkpoint_dir:
        directory = Path(checkpoint_dir)
        try:
            config = target_config(drafter, model_type, architecture)
            _write_checkpoint(
                directory,
                config,
                INT8_W8A8_QUANTIZATION_CONFIG,
                {MTP_TENSOR: torch.zeros(16, 16, dtype=torch.bfloat16)},
            )
            draft, vllm_config, mla = _build(drafter, directory, architecture)
        # Any failure is the row's finding.
        except Exception as error:  # noqa: BLE001
            return {**result, "build": _failure_in(directory, error)}
        hidden_layers = vllm_config.model_config.hf_text_config.num_hidden_layers
        result |= {
            "drafter_class": type(draft).__name__,
            "draft_quant_decision": draft_quant_decision(vllm_config),
            "linears": describe_linears(draft),
            "hidden_layers": hidden_layers,
            "mla": mla,
            "namings": accepted_namings(draft, hidden_layers),
        }
        result["bad_loads"] = bad_loads(draft, vllm_config, directory, result["namings"])
        modules = checkpoint_linears(
            result["namings"], result["linears"], getattr(draft, "packed_modules_mapping", {})
        )
    result["own_scheme"] = own_scheme(drafter, config, architecture, result["namings"], modules)
    return result


def run(drafter: Drafter) -> dict:
    """The first target whose draft builds, else the first target's failure."""
    try:
        targets = _targets(drafter)
    except LookupError as error:
        return {"config": failure(error)}
    first = None
    for model_type, architecture in targets:
        result = build(drafter, model_type, architecture)
        if "build" not in result:
            return result
        first = first or result
    return first


def probe() -> dict:
    import vllm

    tree = directory_reader(Path(vllm.__file__).resolve().parents[1])
    return {drafter.key: run(drafter) for drafter in read_drafters(tree)}
