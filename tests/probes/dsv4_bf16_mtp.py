"""Probe section: DeepSeek-V4 MTP on quantized checkpoints whose MTP layer is BF16. Three parts:

* ``maths``: the BF16 wo_a projection (inverse RoPE, then one matmul per output group) on fresh random
  inputs of DeepSeek-V4-Flash shapes and ratios, against a float64 reference written here
  independently (complex rotation). Under the v0.22.1 series that is the series' own
  ``inv_rope_grouped_wo_a`` (into an output poisoned with NaN first); under vLLM 0.32+ upstream's
  ``deep_gemm_fp8_o_proj`` BF16 branch, whose inverse RoPE is a Triton kernel and is stood in for by an
  exact one (so there the grouping and the matmuls are what is checked).
* ``drafts``: tiny DeepSeek-V4 checkpoints (a main-model quantization config and the MTP layer's
  tensors ``mtp.0.*`` with real shapes) built into the MTP draft as CUDA builds it
  (mtp_vllm.deepseek_v4_stand_ins), loaded by the engine's default loader, then the MTP block's
  attention output projection run: which path it takes (BF16 or FP8 kernels, and with which scale),
  and for BF16 how far its output is from a float64 reference computed from the loaded weights, and
  whether torch.compile (Dynamo, full graph, aot_eager) traces it to the same output.
* ``scale_name``: the v0.22.1 series' build-time rule on a wo_a whose FP8 scale or dtype is unusable.

Stood in for, CUDA-bound only, while the projection runs: the attention kernel op (vLLM 0.22.1 runs the
projection inside the attention wrapper: the stand-in returns the probe's attention output), the fused
inverse-RoPE FP8 quant kernel and the DeepGEMM FP8 einsum (both record their inputs), and on vLLM 0.32+
the inverse RoPE of the BF16 branch (a custom op, as the Triton kernel is, so torch.compile sees the
same graph boundary).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from safetensors.torch import save_file

from tests.probes.mtp_draft_construction import CONSTRUCTION_ONLY
from tests.probes.mtp_vllm import CT_FP8_BLOCK_GROUP, build_and_load, deepseek_v4_stand_ins, failure

# Per attention layer of DeepSeek-V4-Flash: 64 heads of 512 (448 NoPE + 64 RoPE) in 8 output
# groups, o_lora_rank 1024. "flash_ratios" keeps every ratio at an eighth of the width.
MATHS_SHAPES = {
    "flash": {"tokens": 3, "heads": 64, "groups": 8, "head_dim": 512, "rope_dim": 64, "o_lora_rank": 1024},
    "flash_ratios": {
        "tokens": 9,
        "heads": 64,
        "groups": 8,
        "head_dim": 64,
        "rope_dim": 8,
        "o_lora_rank": 128,
    },
}
MAX_POSITION = 4096

# The construction probe's tiny DeepSeek-V4, whose widths are multiples of 128 so FP8 128x128 blocks
# fit every linear.
TINY_DSV4_CONFIG = CONSTRUCTION_ONLY["deepseek_v4"].hf_config
NUM_HIDDEN_LAYERS = TINY_DSV4_CONFIG["num_hidden_layers"]
DRAFT_LAYER = f"model.layers.{NUM_HIDDEN_LAYERS}"
HIDDEN = TINY_DSV4_CONFIG["hidden_size"]
HEAD_DIM = TINY_DSV4_CONFIG["head_dim"]
O_LORA_RANK = TINY_DSV4_CONFIG["o_lora_rank"]
Q_LORA_RANK = TINY_DSV4_CONFIG["q_lora_rank"]
MOE_INTERMEDIATE = TINY_DSV4_CONFIG["moe_intermediate_size"]
HEADS = TINY_DSV4_CONFIG["num_attention_heads"]
O_GROUPS = TINY_DSV4_CONFIG["o_groups"]
ROUTED_EXPERTS = TINY_DSV4_CONFIG["n_routed_experts"]
HC_MULT = TINY_DSV4_CONFIG["hc_mult"]
VOCAB = TINY_DSV4_CONFIG["vocab_size"]

FP8_BLOCK = CT_FP8_BLOCK_GROUP
W4A16_EXPERTS = {
    "format": "pack-quantized",
    "targets": [r"re:.*\.experts\..*"],
    "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128},
}
# DeepseekV4Attention reads scale_fmt from every checkpoint's quantization_config.
QUANTIZATION_CONFIGS = {
    # The layout of W4A16-FP8 DeepSeek-V4-Flash releases (seeds 003, 004): FP8 block linears,
    # W4A16 routed experts.
    "ct_w4a16_fp8": {
        "quant_method": "compressed-tensors",
        "format": "mixed-precision",
        "scale_fmt": None,
        "ignore": ["lm_head"],
        "config_groups": {"linears": FP8_BLOCK, "experts": W4A16_EXPERTS},
    },
    # compressed-tensors FP8 block everywhere but the routed experts: scales named weight_scale.
    "ct_fp8": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "scale_fmt": None,
        "ignore": ["lm_head", r"re:.*\.experts\..*"],
        "config_groups": {"linears": FP8_BLOCK},
    },
    # What seed 004 tried: ignore the MTP layer by its draft layer index.
    "ct_fp8_ignoring_the_mtp_layer": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "scale_fmt": None,
        "ignore": ["lm_head", r"re:.*\.experts\..*", rf"re:.*layers\.{NUM_HIDDEN_LAYERS}\..*"],
        "config_groups": {"linears": FP8_BLOCK},
    },
    # DeepSeek's own FP8 release format: scales named weight_scale_inv once loaded.
    "native_fp8": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "scale_fmt": "ue8m0",
    },
}

# The MTP layer's linears as the checkpoint names them, (out, in).
MTP_LINEARS = {
    "mtp.0.e_proj": (HIDDEN, HIDDEN),
    "mtp.0.h_proj": (HIDDEN, HIDDEN),
    "mtp.0.attn.wq_a": (Q_LORA_RANK, HIDDEN),
    "mtp.0.attn.wkv": (HEAD_DIM, HIDDEN),
    "mtp.0.attn.wq_b": (HEADS * HEAD_DIM, Q_LORA_RANK),
    "mtp.0.attn.wo_a": (O_GROUPS * O_LORA_RANK, HEADS * HEAD_DIM // O_GROUPS),
    "mtp.0.attn.wo_b": (HIDDEN, O_GROUPS * O_LORA_RANK),
    "mtp.0.ffn.shared_experts.w1": (MOE_INTERMEDIATE, HIDDEN),
    "mtp.0.ffn.shared_experts.w2": (HIDDEN, MOE_INTERMEDIATE),
    "mtp.0.ffn.shared_experts.w3": (MOE_INTERMEDIATE, HIDDEN),
}
ROUTED_EXPERT_LINEARS = {
    f"mtp.0.ffn.experts.{expert}.{weight}": (
        (HIDDEN, MOE_INTERMEDIATE) if weight == "w2" else (MOE_INTERMEDIATE, HIDDEN)
    )
    for expert in range(ROUTED_EXPERTS)
    for weight in ("w1", "w2", "w3")
}
HC_DIM = HC_MULT * HIDDEN
HC_MIX = (2 + HC_MULT) * HC_MULT
MTP_OTHER_TENSORS = {
    "mtp.0.enorm.weight": (HIDDEN,),
    "mtp.0.hnorm.weight": (HIDDEN,),
    "mtp.0.norm.weight": (HIDDEN,),
    "mtp.0.head.weight": (VOCAB, HIDDEN),
    "mtp.0.hc_head_fn": (HC_MULT, HC_DIM),
    "mtp.0.hc_head_base": (HC_MULT,),
    "mtp.0.hc_head_scale": (1,),
    "mtp.0.attn_norm.weight": (HIDDEN,),
    "mtp.0.ffn_norm.weight": (HIDDEN,),
    "mtp.0.attn.q_norm.weight": (Q_LORA_RANK,),
    "mtp.0.attn.kv_norm.weight": (HEAD_DIM,),
    "mtp.0.attn.attn_sink": (HEADS,),
    "mtp.0.ffn.gate.weight": (ROUTED_EXPERTS, HIDDEN),
    **{f"mtp.0.hc_{part}_fn": (HC_MIX, HC_DIM) for part in ("attn", "ffn")},
    **{f"mtp.0.hc_{part}_base": (HC_MIX,) for part in ("attn", "ffn")},
    **{f"mtp.0.hc_{part}_scale": (3,) for part in ("attn", "ffn")},
}
FP32_TENSORS = ("hc_", "attn_sink")

# Checkpoint scenario -> (main-model quantization config, how the MTP linears are stored).
# "fp8" stores them as FP8 with the format's scale; "fp8_wo_a_unscaled" likewise but leaves wo_a's
# scale out (bad input).
DRAFT_SCENARIOS = {
    "w4a16_fp8_target_bf16_mtp": ("ct_w4a16_fp8", "bf16"),
    "fp8_target_bf16_mtp": ("ct_fp8", "bf16"),
    "fp8_target_ignoring_bf16_mtp": ("ct_fp8_ignoring_the_mtp_layer", "bf16"),
    "fp8_weight_scale": ("ct_fp8", "fp8"),
    "fp8_weight_scale_inv": ("native_fp8", "fp8"),
    "fp8_wo_a_unscaled": ("ct_fp8", "fp8_wo_a_unscaled"),
}


def fp8_block_scale_shape(shape: tuple[int, int]) -> tuple[int, int]:
    return (math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))


def write_checkpoint(checkpoint_dir: Path, quantization: str, mtp_storage: str, generator) -> None:
    native = quantization == "native_fp8"
    hf_config = {**TINY_DSV4_CONFIG, "quantization_config": QUANTIZATION_CONFIGS[quantization]}
    if native:
        # FP8 block routed experts (DeepSeek-V4-Flash-Base); compressed-tensors ones stay BF16.
        hf_config["expert_dtype"] = "fp8"
    (checkpoint_dir / "config.json").write_text(json.dumps(hf_config))

    def bf16(shape):
        return (torch.randn(shape, generator=generator) / math.sqrt(shape[-1])).to(torch.bfloat16)

    tensors = {
        name: bf16(shape).float() if any(part in name for part in FP32_TENSORS) else bf16(shape)
        for name, shape in MTP_OTHER_TENSORS.items()
    }
    quantized = {} if mtp_storage == "bf16" else {**MTP_LINEARS, **(ROUTED_EXPERT_LINEARS if native else {})}
    for module, shape in {**MTP_LINEARS, **ROUTED_EXPERT_LINEARS}.items():
        if module not in quantized:
            tensors[f"{module}.weight"] = bf16(shape)
            continue
        tensors[f"{module}.weight"] = bf16(shape).to(torch.float8_e4m3fn)
        if mtp_storage == "fp8_wo_a_unscaled" and module.endswith(".wo_a"):
            continue
        # Native releases store the block scale as `.scale`; compressed-tensors as weight_scale.
        scale_name = "scale" if native else "weight_scale"
        tensors[f"{module}.{scale_name}"] = torch.ones(fp8_block_scale_shape(shape))
    save_file(tensors, checkpoint_dir / "model.safetensors")


def inverse_rope_float64(o, positions, cos_sin_cache):
    """Rotate each interleaved (even, odd) RoPE pair back by its angle, as complex numbers."""
    rope_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.double()[positions].chunk(2, dim=-1)
    angle = torch.complex(cos, -sin).unsqueeze(1)
    o = o.double()
    rope = torch.view_as_complex(o[..., -rope_dim:].contiguous().view(*o.shape[:-1], rope_dim // 2, 2))
    return torch.cat((o[..., :-rope_dim], torch.view_as_real(rope * angle).flatten(-2)), dim=-1)


def o_proj_a_float64(o, positions, cos_sin_cache, wo_a_weight, groups):
    unrotated = inverse_rope_float64(o, positions, cos_sin_cache).view(o.shape[0], groups, -1)
    return torch.einsum("tgd,grd->tgr", unrotated, wo_a_weight.double().view(groups, -1, unrotated.shape[-1]))


def rope_cache(rope_dim: int) -> torch.Tensor:
    inverse_frequency = 1.0 / (10000.0 ** (torch.arange(0, rope_dim, 2).float() / rope_dim))
    angles = torch.outer(torch.arange(MAX_POSITION).float(), inverse_frequency)
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.double() - reference).norm() / reference.norm()).item()


# vLLM 0.32+ runs the o_proj in this module (models/deepseek_v4/nvidia/ops/o_proj.py); 0.22.1 inside
# the attention wrapper of models/deepseek_v4/attention.py.
UPSTREAM_O_PROJ = "vllm.models.deepseek_v4.nvidia.ops.o_proj"
FP8_KERNELS = ["inverse_rope_fp8_quant", "fp8_einsum"]


def has_upstream_o_proj() -> bool:
    return importlib.util.find_spec(UPSTREAM_O_PROJ) is not None


@functools.cache
def inverse_rope_op():
    """The BF16 branch's inverse RoPE (a Triton kernel behind a custom op upstream), exact and as a
    custom op of its own: [T, H, D] -> [T, G, H / G * D]."""

    @torch.library.custom_op("mtpq_probe::inverse_rope", mutates_args=())
    def inverse_rope(
        o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, n_groups: int
    ) -> torch.Tensor:
        rotated = inverse_rope_float64(o, positions, cos_sin_cache).to(o.dtype)
        return rotated.reshape(o.shape[0], n_groups, -1)

    @inverse_rope.register_fake
    def _(o, positions, cos_sin_cache, n_groups):
        return o.new_empty(o.shape[0], n_groups, o.shape[1] // n_groups * o.shape[2])

    return inverse_rope


class OProjKernels:
    """Stand-ins for the CUDA kernels around the o_proj: record what the projection hands them."""

    def __init__(self, attention_output: torch.Tensor | None):
        self.attention_output = attention_output
        self.fp8_scale = None
        self.calls = []
        if has_upstream_o_proj():
            # Registered up front: torch.compile must not trace the registration.
            self.inverse_rope = inverse_rope_op()

    def stand_ins(self) -> list[contextlib.AbstractContextManager]:
        from vllm.platforms import current_platform

        if has_upstream_o_proj():
            return [
                mock.patch(f"{UPSTREAM_O_PROJ}.fused_inv_rope_fp8_quant", self.upstream_inverse_rope),
                mock.patch(f"{UPSTREAM_O_PROJ}.fp8_einsum", self.upstream_fp8_einsum),
            ]
        return [
            # As on CUDA: unquantized linears multiply by their weight (0.22.1's CPU platform would
            # have repacked it at load and expects its own GEMM).
            mock.patch.object(type(current_platform), "is_cpu", lambda platform: False),
            mock.patch.object(torch.ops.vllm, "deepseek_v4_attention", self.attention),
            mock.patch.object(torch.ops.vllm, "deepseek_v4_fp8_einsum", self.fp8_einsum),
            mock.patch("vllm.models.deepseek_v4.attention.fused_inv_rope_fp8_quant", self.inv_rope_fp8_quant),
        ]

    # vLLM 0.22.1
    def attention(self, hidden_states, positions, o_padded, layer_name):
        o_padded.zero_()
        o_padded[:, : self.attention_output.shape[1]] = self.attention_output

    def inv_rope_fp8_quant(self, o, *args, **kwargs):
        self.calls.append("inverse_rope_fp8_quant")
        return torch.empty(0), torch.empty(0)

    def fp8_einsum(self, o_fp8, o_scale, weight, weight_scale, out, equation, recipe):
        self.calls.append("fp8_einsum")
        self.fp8_scale = weight_scale
        out.zero_()

    # vLLM 0.32+
    def upstream_inverse_rope(self, o, positions, cos_sin_cache, *, n_groups, quantize, **layout):
        if not quantize:
            return self.inverse_rope(o, positions, cos_sin_cache, n_groups), o.new_empty(0)
        self.calls.append("inverse_rope_fp8_quant")
        rotated = o.new_empty(o.shape[0], n_groups, o.shape[1] // n_groups * o.shape[2])
        return rotated.to(torch.float8_e4m3fn), torch.empty(0)

    def upstream_fp8_einsum(self, equation, activation, weight, out, recipe):
        self.calls.append("fp8_einsum")
        self.fp8_scale = weight[1]
        out.zero_()


def bf16_wo_a_projection():
    """(o, positions, cos_sin_cache, wo_a_weight, groups, o_lora_rank) -> [T, G, o_lora_rank], the
    BF16 wo_a projection this vLLM has; ImportError where it has none."""
    if has_upstream_o_proj():
        deep_gemm_fp8_o_proj = importlib.import_module(UPSTREAM_O_PROJ).deep_gemm_fp8_o_proj

        def project(o, positions, cos_sin_cache, wo_a_weight, groups, o_lora_rank):
            z = deep_gemm_fp8_o_proj(
                o,
                positions,
                cos_sin_cache,
                SimpleNamespace(weight=wo_a_weight),
                lambda flat: flat,  # wo_b: the probe checks z itself
                n_groups=groups,
                heads_per_group=o.shape[1] // groups,
                nope_dim=o.shape[2] - cos_sin_cache.shape[-1],
                rope_dim=cos_sin_cache.shape[-1],
                o_lora_rank=o_lora_rank,
                einsum_recipe=(1, 128, 128),
                tma_aligned_scales=False,
            )
            return z.view(o.shape[0], groups, o_lora_rank)

        return project
    from vllm.models.deepseek_v4.attention import inv_rope_grouped_wo_a

    def project(o, positions, cos_sin_cache, wo_a_weight, groups, o_lora_rank):
        out = torch.full((o.shape[0], groups, o_lora_rank), float("nan"), dtype=torch.bfloat16)
        inv_rope_grouped_wo_a(o, positions, cos_sin_cache, wo_a_weight, out)
        return out

    return project


def run_maths(generator) -> dict:
    try:
        project = bf16_wo_a_projection()
    except ImportError as error:
        return failure(error)
    kernels = OProjKernels(attention_output=None)
    results = {}
    for name, shape in MATHS_SHAPES.items():
        tokens, heads, groups = shape["tokens"], shape["heads"], shape["groups"]
        o = torch.randn(tokens, heads, shape["head_dim"], generator=generator).to(torch.bfloat16)
        positions = torch.randint(0, MAX_POSITION, (tokens,), generator=generator)
        cos_sin_cache = rope_cache(shape["rope_dim"])
        in_features = heads // groups * shape["head_dim"]
        wo_a_weight = (
            torch.randn(groups * shape["o_lora_rank"], in_features, generator=generator)
            / math.sqrt(in_features)
        ).to(torch.bfloat16)
        with contextlib.ExitStack() as stack:
            for stand_in in kernels.stand_ins():
                stack.enter_context(stand_in)
            out = project(o, positions, cos_sin_cache, wo_a_weight, groups, shape["o_lora_rank"])
        reference = o_proj_a_float64(o, positions, cos_sin_cache, wo_a_weight, groups)
        results[name] = {
            "unwritten": int(out.isnan().sum()),
            "relative_error": relative_error(out.nan_to_num(), reference),
            "fp8_kernels": kernels.calls,
        }
    return results


def o_proj_of(attention_layer, hidden_states):
    """The MTP block's attention output projection as (o, positions) -> output: vLLM 0.32+'s layer
    method; under 0.22.1 the attention wrapper's forward, whose attention kernel the stand-in makes
    return o."""
    if has_upstream_o_proj():
        return attention_layer._o_proj
    return lambda o, positions: attention_layer.mla_attn(positions, hidden_states)


def vllm_compiles_deepseek_v4() -> bool:
    """Whether vLLM torch.compiles DeepSeek-V4's forward (0.22.1 does, with full graphs; 0.32 runs it
    eagerly between breakable CUDA graphs)."""
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper
    from vllm.models.deepseek_v4.nvidia.model import DeepseekV4Model

    return issubclass(DeepseekV4Model, TorchCompileWithNoGuardsWrapper)


def prepare_wo_b(attention_layer) -> torch.Tensor:
    """wo_b's weight as loaded; on vLLM 0.32+, whose unquantized linears pick their GEMM when built,
    a BF16 wo_b is then packed for the CPU GEMM as the CPU engine does after loading."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    wo_b = attention_layer.wo_b
    weight = wo_b.weight.detach().clone()
    if has_upstream_o_proj() and isinstance(wo_b.quant_method, UnquantizedLinearMethod):
        wo_b.quant_method.process_weights_after_loading(wo_b)
    return weight


def run_o_proj(attention_layer, generator) -> dict:
    """Run the MTP block's attention output projection on a random attention output; a BF16 one
    also compiled (Dynamo, full graph) as vLLM compiles the model's forward where it does."""
    tokens = 5
    o = torch.randn(tokens, HEADS, HEAD_DIM, generator=generator).to(torch.bfloat16)
    positions = torch.randint(0, 256, (tokens,), generator=generator)
    kernels = OProjKernels(o)
    o_proj = o_proj_of(attention_layer, torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16))
    wo_b_weight = prepare_wo_b(attention_layer)
    with contextlib.ExitStack() as stack:
        for stand_in in kernels.stand_ins():
            stack.enter_context(stand_in)
        output = o_proj(o, positions)
        wo_a = attention_layer.wo_a
        result = {"fp8_kernels": kernels.calls, "fp8_scale": None}
        for scale_name in ("weight_scale_inv", "weight_scale"):
            if kernels.fp8_scale is not None and kernels.fp8_scale is getattr(wo_a, scale_name, None):
                result["fp8_scale"] = scale_name
        if kernels.calls:
            return result
        cos_sin_cache = attention_layer.rotary_emb.cos_sin_cache
        z = o_proj_a_float64(o, positions, cos_sin_cache, wo_a.weight, O_GROUPS)
        result["relative_error"] = relative_error(output, z.flatten(1) @ wo_b_weight.double().T)
        result["compiled_by_vllm"] = vllm_compiles_deepseek_v4()
        compiled = torch.compile(o_proj, fullgraph=True, backend="aot_eager")
        try:
            result["compiled_equals_eager"] = torch.equal(compiled(o, positions), output)
        except Exception as exc:  # noqa: BLE001
            result["compiled_equals_eager"] = failure(exc)
    return result


def run_draft_scenario(quantization: str, mtp_storage: str, generator) -> dict:
    def wo_a_and_o_proj(draft) -> dict:
        attention_layer = draft.model.layers[str(NUM_HIDDEN_LAYERS)].mtp_block.attn
        try:
            o_proj = run_o_proj(attention_layer, generator)
        # Any failure is a finding to report, not a probe crash.
        except Exception as exc:  # noqa: BLE001
            o_proj = failure(exc)
        return {"wo_a_weight_dtype": str(attention_layer.wo_a.weight.dtype), "o_proj": o_proj}

    with tempfile.TemporaryDirectory(prefix="mtpq-dsv4-") as checkpoint_dir:
        write_checkpoint(Path(checkpoint_dir), quantization, mtp_storage, generator)
        return build_and_load(
            Path(checkpoint_dir), deepseek_v4_stand_ins, cache_dtype="fp8", after_load=wo_a_and_o_proj
        )


def run_scale_name_rule() -> dict:
    """The v0.22.1 series' wo_a_fp8_scale_name on an FP8 wo_a stripped of its scale, and on a uint8
    (packed) weight."""
    try:
        from vllm.models.deepseek_v4.attention import wo_a_fp8_scale_name
    except ImportError as error:
        return failure(error)
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    wo_a = ColumnParallelLinear(
        256, 256, bias=False, params_dtype=torch.bfloat16, prefix=f"{DRAFT_LAYER}.mtp_block.attn.wo_a"
    )
    results = {}
    for case, dtype in (("fp8_without_scale", torch.float8_e4m3fn), ("uint8", torch.uint8)):
        wo_a.weight.data = torch.empty(256, 256, dtype=dtype)
        try:
            results[case] = {"scale_name": wo_a_fp8_scale_name(wo_a)}
        except Exception as exc:  # noqa: BLE001
            results[case] = failure(exc)
    return results


def probe() -> dict:
    # Fresh inputs every run; the seed is reported so a failure can be replayed.
    seed = int.from_bytes(os.urandom(4), "little")
    generator = torch.Generator().manual_seed(seed)
    return {
        "seed": seed,
        "maths": run_maths(generator),
        "drafts": {
            name: run_draft_scenario(quantization, mtp_storage, generator)
            for name, (quantization, mtp_storage) in DRAFT_SCENARIOS.items()
        },
        "scale_name": run_scale_name_rule(),
    }
