"""Checkpoints described by their safetensors headers: real model layouts at any size, written without
torch. Tensor data is a hole in a sparse file (no disk used) unless a test gives bytes for it. The
doctor and graft read headers only, so these are all they need.

Layouts follow the releases they are named after (tensor names, MTP prefixes, config fields); sizes
are small unless a test asks for real ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"F32": 4, "I32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I8": 1, "U8": 1}
INDEX_FILE = "model.safetensors.index.json"


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, list[int]]], data: dict[str, bytes] | None = None
):
    """A safetensors file of {name: (dtype, shape)}; `data` gives some tensors' bytes, the rest are holes."""
    data = data or {}
    entries, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps({"__metadata__": {"format": "pt"}, **entries}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as file:
        file.write(len(header).to_bytes(8, "little") + header)
        start = file.tell()
        for name, payload in data.items():
            assert len(payload) == entries[name]["data_offsets"][1] - entries[name]["data_offsets"][0]
            file.seek(start + entries[name]["data_offsets"][0])
            file.write(payload)
        file.truncate(start + offset)


def header_bytes(path: Path) -> int:
    """8 + the header length the file declares (read without touching its data)."""
    with open(path, "rb") as file:
        return 8 + int.from_bytes(file.read(8), "little")


def write_checkpoint(
    directory: Path,
    config: dict,
    shards: dict[str, dict[str, tuple[str, list[int]]]],
    *,
    index: bool | None = None,
    data: dict[str, bytes] | None = None,
) -> Path:
    """config.json, the shards (file -> tensors) and, for several shards or index=True, the index."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    for file, tensors in shards.items():
        write_safetensors(directory / file, tensors, {n: b for n, b in (data or {}).items() if n in tensors})
    if index if index is not None else len(shards) > 1:
        weight_map = {name: file for file, tensors in shards.items() for name in tensors}
        total = sum(
            DTYPE_BYTES[dtype] * _product(shape)
            for tensors in shards.values()
            for dtype, shape in tensors.values()
        )
        (directory / INDEX_FILE).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
        )
    return directory


def _product(shape) -> int:
    result = 1
    for dim in shape:
        result *= dim
    return result


# --- linears in the formats quantizers write ----------------------------------------------------------
OUT, IN = 64, 64


def linear(module: str, fmt: str, out: int = OUT, inp: int = IN) -> dict[str, tuple[str, list[int]]]:
    if fmt == "bf16":
        return {f"{module}.weight": ("BF16", [out, inp])}
    if fmt == "int8":  # compressed-tensors int-quantized
        return {f"{module}.weight": ("I8", [out, inp]), f"{module}.weight_scale": ("BF16", [out, 1])}
    if fmt == "fp8":  # compressed-tensors float-quantized, ModelOpt FP8
        return {f"{module}.weight": ("F8_E4M3", [out, inp]), f"{module}.weight_scale": ("F32", [out, 1])}
    if fmt == "fp8-block":  # DeepSeek's FP8 releases
        return {
            f"{module}.weight": ("F8_E4M3", [out, inp]),
            f"{module}.weight_scale_inv": ("F32", [-(-out // 128), -(-inp // 128)]),
        }
    if fmt == "w4a16":  # compressed-tensors pack-quantized
        return {
            f"{module}.weight_packed": ("I32", [out, inp // 8]),
            f"{module}.weight_scale": ("BF16", [out, inp // 32]),
            f"{module}.weight_shape": ("I32", [2]),
        }
    if fmt == "ct-nvfp4":  # compressed-tensors nvfp4-pack-quantized
        return {
            f"{module}.weight_packed": ("U8", [out, inp // 2]),
            f"{module}.weight_scale": ("F8_E4M3", [out, inp // 16]),
            f"{module}.weight_global_scale": ("F32", [1]),
        }
    if fmt in ("gptq", "awq"):  # 4-bit, groups of 32: GPTQ packs along the input, AWQ the output
        packed = [inp // 8, out] if fmt == "gptq" else [inp, out // 8]
        found = {
            f"{module}.qweight": ("I32", packed),
            f"{module}.qzeros": ("I32", [inp // 32, out // 8]),
            f"{module}.scales": ("F16", [inp // 32, out]),
        }
        return found | ({f"{module}.g_idx": ("I32", [inp])} if fmt == "gptq" else {})
    if fmt == "nvfp4":  # ModelOpt NVFP4
        return {
            f"{module}.weight": ("U8", [out, inp // 2]),
            f"{module}.weight_scale": ("F8_E4M3", [out, inp // 16]),
            f"{module}.weight_scale_2": ("F32", []),
            f"{module}.input_scale": ("F32", []),
        }
    raise ValueError(fmt)


def norm(name: str) -> dict[str, tuple[str, list[int]]]:
    return {f"{name}.weight": ("BF16", [IN])}


def _one_group(fmt: str, weights: dict, **activations) -> dict:
    """A compressed-tensors config whose one group targets every Linear."""
    group = {"targets": ["Linear"], "weights": weights, "format": fmt}  # llm-compressor writes both
    if activations:
        group["input_activations"] = activations
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group}}


COMPRESSED_TENSORS = {
    "int8": _one_group(
        "int-quantized",
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        num_bits=8,
        type="int",
        strategy="token",
        dynamic=True,
    ),
    "w4a16": _one_group(
        "pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}
    ),
    "fp8": _one_group("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel"}),
}


def compressed_tensors(fmt: str, ignore: list[str]) -> dict:
    return {**COMPRESSED_TENSORS[fmt], "ignore": list(ignore)}


def quark_entry(weight: object, inputs: object = None) -> dict:
    """A Quark layer entry (global_quant_config, layer_quant_config values)."""
    return {"weight": weight, "input_tensors": inputs, "output_tensors": None, "bias": None}


QUARK_INT8_WEIGHT = {
    "dtype": "int8",
    "qscheme": "per_channel",
    "ch_axis": 0,
    "symmetric": True,
    "is_dynamic": False,
}
QUARK_FP8_WEIGHT = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
QUARK_INT8 = quark_entry(
    QUARK_INT8_WEIGHT, {"dtype": "int8", "qscheme": "per_channel", "symmetric": True, "is_dynamic": True}
)
QUARK_FP8 = quark_entry(QUARK_FP8_WEIGHT, QUARK_FP8_WEIGHT)


def quark(global_entry: dict, layer_quant_config: dict | None = None, exclude: list[str] = ()) -> dict:
    """A Quark quantization_config as Quark exports it."""
    return {
        "quant_method": "quark",
        "export": {"kv_cache_group": [], "pack_method": "reorder"},
        "global_quant_config": global_entry,
        "layer_type_quant_config": {},
        "layer_quant_config": layer_quant_config or {},
        "exclude": ["lm_head", *exclude],
    }


# --- real MTP layouts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """A model family's config and tensor names, its MTP layer where its releases keep it."""

    name: str
    config: dict
    mtp_layout: str  # as the doctor reports it
    count_source: str  # the words the doctor cites for the MTP layer count
    main: Callable[[str], dict]  # format -> the main model's tensors
    mtp: Callable[[str], dict]  # format -> the MTP layer's tensors
    nested: bool = False  # MTP fields in text_config

    @property
    def num_hidden_layers(self) -> int:
        return (self.config.get("text_config") or self.config)["num_hidden_layers"]

    def count_holder(self, config: dict) -> dict:
        return config["text_config"] if self.nested else config

    def tensors(self, main_fmt: str, mtp_fmt: str = "bf16") -> dict:
        return {**self.main(main_fmt), **self.mtp(mtp_fmt)}


def _attention(prefix: str, fmt: str) -> dict:
    return {
        k: v
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj")
        for k, v in linear(f"{prefix}.{proj}", fmt).items()
    }


def _mlp(prefix: str, fmt: str) -> dict:
    return {
        k: v
        for proj in ("gate_proj", "up_proj", "down_proj")
        for k, v in linear(f"{prefix}.{proj}", fmt).items()
    }


def _decoder_layer(prefix: str, fmt: str, experts: int = 0) -> dict:
    tensors = {**norm(f"{prefix}.input_layernorm"), **norm(f"{prefix}.post_attention_layernorm")}
    tensors |= _attention(f"{prefix}.self_attn", fmt)
    if not experts:
        return tensors | _mlp(f"{prefix}.mlp", fmt)
    tensors |= linear(f"{prefix}.mlp.gate", "bf16", experts, IN) | _mlp(f"{prefix}.mlp.shared_experts", fmt)
    return tensors | {k: v for e in range(experts) for k, v in _mlp(f"{prefix}.mlp.experts.{e}", fmt).items()}


def _embeddings(prefix: str = "model") -> dict:
    return {
        f"{prefix}.embed_tokens.weight": ("BF16", [256, IN]),
        f"{prefix}.norm.weight": ("BF16", [IN]),
        "lm_head.weight": ("BF16", [256, IN]),
    }


def _dense_main(layers: int, experts: int = 0):
    return lambda fmt: {
        **_embeddings(),
        **{k: v for i in range(layers) for k, v in _decoder_layer(f"model.layers.{i}", fmt, experts).items()},
    }


def _deepseek_style_mtp(layer: int, head: str, experts: int = 0, embed: bool = False):
    prefix = f"model.layers.{layer}"

    def tensors(fmt: str) -> dict:
        found = {**norm(f"{prefix}.enorm"), **norm(f"{prefix}.hnorm"), **norm(f"{prefix}.shared_head.norm")}
        found |= linear(f"{prefix}.eh_proj", fmt, IN, 2 * IN) | linear(f"{prefix}.{head}", "bf16", 256, IN)
        if embed:
            found |= linear(f"{prefix}.embed_tokens", "bf16", 256, IN)
        return found | _decoder_layer(prefix, fmt, experts)

    return tensors


def _mimo_mtp(fmt: str) -> dict:
    prefix = "model.mtp_layers.0"
    found = {
        **norm(f"{prefix}.token_layernorm"),
        **norm(f"{prefix}.hidden_layernorm"),
        **norm(f"{prefix}.final_layernorm"),
    }
    return found | linear(f"{prefix}.input_proj", fmt, IN, 2 * IN) | _decoder_layer(prefix, fmt)


def _dsv4_block(prefix: str, fmt: str) -> dict:
    """A DeepSeek-V4 block's attention and MoE linears (one routed expert, the shared one)."""
    tensors = {}
    for proj in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b"):
        tensors |= linear(f"{prefix}.attn.{proj}", fmt)
    for proj in ("w1", "w2", "w3"):
        tensors |= linear(f"{prefix}.ffn.experts.0.{proj}", fmt) | linear(
            f"{prefix}.ffn.shared_experts.{proj}", fmt
        )
    return tensors


def _dsv4_main(fmt: str) -> dict:
    tensors = {
        "embed.weight": ("BF16", [256, IN]),
        "norm.weight": ("BF16", [IN]),
        "head.weight": ("BF16", [256, IN]),
    }
    for i in range(2):
        tensors |= _dsv4_block(f"layers.{i}", fmt)
    return tensors


def _dsv4_mtp(fmt: str) -> dict:
    tensors = {**norm("mtp.0.enorm"), **norm("mtp.0.hnorm"), **norm("mtp.0.norm")}
    tensors |= (
        linear("mtp.0.e_proj", fmt) | linear("mtp.0.h_proj", fmt) | linear("mtp.0.ffn.gate", "bf16", 4, IN)
    )
    return tensors | _dsv4_block("mtp.0", fmt)


def _qwen3_5_main(fmt: str) -> dict:
    tensors = _embeddings("model.language_model") | linear("model.visual.blocks.0.mlp.linear_fc1", "bf16")
    for i in range(2):
        tensors |= _decoder_layer(f"model.language_model.layers.{i}", fmt, experts=2)
    return tensors


def _qwen3_5_mtp(fmt: str) -> dict:
    tensors = {**norm("mtp.pre_fc_norm_embedding"), **norm("mtp.pre_fc_norm_hidden"), **norm("mtp.norm")}
    return tensors | linear("mtp.fc", fmt, IN, 2 * IN) | _decoder_layer("mtp.layers.0", fmt, experts=2)


def _config(architecture: str, model_type: str, layers: int = 2, **extra) -> dict:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": IN,
        "vocab_size": 256,
        "num_hidden_layers": layers,
        **extra,
    }


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout(
            "mimo",
            _config("MiMoForCausalLM", "mimo", num_nextn_predict_layers=1),
            "model.mtp_layers.{i}.",
            "num_nextn_predict_layers",
            _dense_main(2),
            _mimo_mtp,
        ),
        Layout(
            "glm4_moe",
            _config("Glm4MoeForCausalLM", "glm4_moe", num_nextn_predict_layers=1, n_routed_experts=2),
            "model.layers.{N+i}.",
            "num_nextn_predict_layers",
            _dense_main(2, experts=2),
            _deepseek_style_mtp(2, "shared_head.head", experts=2),
        ),
        Layout(
            "step3p5",
            _config("Step3p5ForCausalLM", "step3p5", num_nextn_predict_layers=1),
            "model.layers.{N+i}.",
            "num_nextn_predict_layers",
            _dense_main(2),
            _deepseek_style_mtp(2, "shared_head.output"),
        ),
        Layout(
            "deepseek_v3",
            _config(
                "DeepseekV3ForCausalLM", "deepseek_v3", 3, num_nextn_predict_layers=1, n_routed_experts=2
            ),
            "model.layers.{N+i}.",
            "num_nextn_predict_layers",
            _dense_main(3, experts=2),
            _deepseek_style_mtp(3, "shared_head.head", experts=2, embed=True),
        ),
        Layout(
            "deepseek_v4",
            _config("DeepseekV4ForCausalLM", "deepseek_v4", num_nextn_predict_layers=1),
            "mtp.{i}.",
            "num_nextn_predict_layers",
            _dsv4_main,
            _dsv4_mtp,
        ),
        Layout(
            "qwen3_5",
            {
                "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                "model_type": "qwen3_5_moe",
                "text_config": {
                    "model_type": "qwen3_5_moe_text",
                    "hidden_size": IN,
                    "vocab_size": 256,
                    "num_hidden_layers": 2,
                    "mtp_num_hidden_layers": 1,
                    "mtp_use_dedicated_embeddings": False,
                },
                "vision_config": {"depth": 1},
            },
            "mtp.",
            "text_config.mtp_num_hidden_layers",
            _qwen3_5_main,
            _qwen3_5_mtp,
            nested=True,
        ),
    )
}


# --- a DeepSeek-V3-sized release ------------------------------------------------------------------------
DSV3_LAYERS, DSV3_EXPERTS, DSV3_HIDDEN, DSV3_EXPERT_DIM, DSV3_VOCAB = 61, 256, 7168, 2048, 129280
DSV3_FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def write_deepseek_v3_shaped(directory: Path, shards_per_layer: int = 4, mtp_fmt: str = "fp8-block") -> Path:
    """DeepSeek-V3's FP8 release as its headers lay it out (61 decoder layers of 256 FP8 block-scaled
    experts, one MTP layer), at full size in sparse files: `shards_per_layer` shards a layer."""
    config = _config(
        "DeepseekV3ForCausalLM",
        "deepseek_v3",
        DSV3_LAYERS,
        hidden_size=DSV3_HIDDEN,
        vocab_size=DSV3_VOCAB,
        num_nextn_predict_layers=1,
        quantization_config=DSV3_FP8_CONFIG,
    )
    shards = {"model-embed.safetensors": linear("model.embed_tokens", "bf16", DSV3_VOCAB, DSV3_HIDDEN)}
    for layer in range(DSV3_LAYERS + 1):
        prefix, fmt = f"model.layers.{layer}", mtp_fmt if layer == DSV3_LAYERS else "fp8-block"
        tensors = {
            **linear(f"{prefix}.self_attn.q_a_proj", fmt, 1536, DSV3_HIDDEN),
            **linear(f"{prefix}.self_attn.q_b_proj", fmt, 24576, 1536),
            **linear(f"{prefix}.self_attn.kv_a_proj_with_mqa", fmt, 576, DSV3_HIDDEN),
            **linear(f"{prefix}.self_attn.kv_b_proj", fmt, 32768, 512),
            **linear(f"{prefix}.self_attn.o_proj", fmt, DSV3_HIDDEN, 16384),
            **linear(f"{prefix}.mlp.gate", "bf16", DSV3_EXPERTS, DSV3_HIDDEN),
        }
        for expert in range(DSV3_EXPERTS):
            for proj, shape in (
                ("gate_proj", (2048, 7168)),
                ("up_proj", (2048, 7168)),
                ("down_proj", (7168, 2048)),
            ):
                tensors |= linear(f"{prefix}.mlp.experts.{expert}.{proj}", fmt, *shape)
        if layer == DSV3_LAYERS:
            tensors |= linear(f"{prefix}.eh_proj", "bf16", DSV3_HIDDEN, 2 * DSV3_HIDDEN)
            tensors |= linear(f"{prefix}.shared_head.head", "bf16", DSV3_VOCAB, DSV3_HIDDEN)
        names = list(tensors)
        for shard in range(shards_per_layer):
            part = names[shard::shards_per_layer]
            shards[f"model-{layer:02d}-{shard}.safetensors"] = {name: tensors[name] for name in part}
    shards["model-final.safetensors"] = {
        **norm("model.norm"),
        **linear("lm_head", "bf16", DSV3_VOCAB, DSV3_HIDDEN),
    }
    return write_checkpoint(directory, config, shards, index=True)
