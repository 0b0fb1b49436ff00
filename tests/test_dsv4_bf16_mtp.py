"""Issue 4, DeepSeek-V4: the BF16 o_proj fallback (patch 0008) and the MTP draft of a quantized
checkpoint whose MTP layer is BF16 (patches 0001-0008).

tests/probes/dsv4_bf16_mtp.py checks the BF16 o_proj maths against float64 on fresh random inputs,
builds and loads DeepSeek-V4 MTP drafts from tiny checkpoints the way the proposer and the default
loader do, and runs the MTP block's o_proj with only the CUDA kernels stood in. One probe process
per vLLM variant.
"""

from __future__ import annotations

import pytest

PROBE = "dsv4_bf16_mtp"
DRAFT_LAYER = "model.layers.2"
# Relative Frobenius error allowed for BF16 inputs and output.
BF16_TOLERANCE = 1e-2
# The MTP layer's linears and experts, plus its head, as the draft names them.
MTP_MODULES = {
    f"{DRAFT_LAYER}.{name}"
    for name in (
        "e_proj",
        "h_proj",
        "shared_head.head",
        "mtp_block.attn.fused_wqa_wkv",
        "mtp_block.attn.wq_b",
        "mtp_block.attn.wo_a",
        "mtp_block.attn.wo_b",
        "mtp_block.ffn.shared_experts.gate_up_proj",
        "mtp_block.ffn.shared_experts.down_proj",
        "mtp_block.ffn.experts",
    )
}
UNQUANTIZED = {"UnquantizedLinearMethod", "UnquantizedFusedMoEMethod", "UnquantizedEmbeddingMethod"}
# The proposer gives the draft the target's embedding; the MTP checkpoint has none.
SHARED_WITH_TARGET = ["model.embed_tokens.weight"]
# Checkpoints whose MTP layer is BF16 (see DRAFT_SCENARIOS in the probe).
BF16_MTP = ("w4a16_fp8_target_bf16_mtp", "fp8_target_bf16_mtp", "fp8_target_ignoring_bf16_mtp")
FP8_MTP = {"fp8_weight_scale": "weight_scale", "fp8_weight_scale_inv": "weight_scale_inv"}
FP8_KERNELS = ["fused_inv_rope_fp8_quant", "deepseek_v4_fp8_einsum"]
MISSING_WEIGHT_SCALE_INV = "'ColumnParallelLinear' object has no attribute 'weight_scale_inv'"


@pytest.fixture(scope="module")
def probe(vllm_probe):
    """`probe(variant)`: the probe's verdict for that vLLM."""
    return lambda variant: vllm_probe(PROBE, variant)


@pytest.mark.parametrize("shape", ["flash", "flash_ratios"])
def test_bf16_o_proj_matches_float64_and_writes_every_output_element(probe, shape):
    verdict = probe("patched")
    maths = verdict["maths"][shape]
    assert maths["unwritten"] == 0, verdict["seed"]
    assert maths["relative_error"] <= BF16_TOLERANCE, (maths, verdict["seed"])


def test_unpatched_vllm_has_no_bf16_o_proj(probe):
    assert probe("unpatched")["maths"]["error_type"] == "ImportError"


@pytest.mark.parametrize("scenario", BF16_MTP)
def test_patched_bf16_wo_a_takes_the_fallback_and_matches_float64(probe, scenario):
    draft = probe("patched")["drafts"][scenario]
    assert draft["wo_a_weight_dtype"] == "torch.bfloat16"
    assert draft["o_proj"]["fp8_kernels"] == []
    assert draft["o_proj"]["relative_error"] <= BF16_TOLERANCE
    # vLLM compiles the model's forward with full graphs: the fallback must trace without a break.
    assert draft["o_proj"]["compiled_equals_eager"] is True


def test_unpatched_bf16_wo_a_fails_at_the_first_forward(probe):
    """Seed 004's AttributeError: the MTP layer ignored by index gets a BF16 wo_a, which stock
    vLLM's o_proj reads as FP8."""
    draft = probe("unpatched")["drafts"]["fp8_target_ignoring_bf16_mtp"]
    assert draft["wo_a_weight_dtype"] == "torch.bfloat16"
    assert draft["o_proj"] == {"error_type": "AttributeError", "error": MISSING_WEIGHT_SCALE_INV}


@pytest.mark.parametrize("scenario", sorted(FP8_MTP))
def test_patched_fp8_wo_a_takes_the_fp8_kernels_with_its_scale(probe, scenario):
    draft = probe("patched")["drafts"][scenario]
    assert draft["wo_a_weight_dtype"] == "torch.float8_e4m3fn"
    assert draft["o_proj"] == {"fp8_kernels": FP8_KERNELS, "fp8_scale": FP8_MTP[scenario]}


def test_fp8_path_with_weight_scale_inv_is_unchanged(probe):
    scenario = "fp8_weight_scale_inv"
    assert probe("unpatched")["drafts"][scenario]["o_proj"] == probe("patched")["drafts"][scenario]["o_proj"]


def test_unpatched_fp8_wo_a_with_weight_scale_fails(probe):
    """compressed-tensors FP8 names the block scale weight_scale; stock reads weight_scale_inv."""
    assert probe("unpatched")["drafts"]["fp8_weight_scale"]["o_proj"] == {
        "error_type": "AttributeError",
        "error": MISSING_WEIGHT_SCALE_INV,
    }


@pytest.mark.parametrize("scenario", BF16_MTP)
def test_patched_bf16_mtp_layer_is_built_unquantized_and_fully_loaded(probe, scenario):
    draft = probe("patched")["drafts"][scenario]
    assert draft["draft_quant_decision"] == {"mtp_layer": "none", "block": "none"}
    assert MTP_MODULES <= set(draft["quant_methods"])
    assert set(draft["quant_methods"].values()) <= UNQUANTIZED, draft["quant_methods"]
    assert draft["load"] == "ok"
    assert draft["unloaded_parameters"] == SHARED_WITH_TARGET


def test_unpatched_w4a16_target_cannot_load_a_bf16_mtp_layer(probe):
    """Seed 004's KeyError: the experts are built W4A16 (w13_weight_packed) and the BF16 expert
    tensors look for w13_weight."""
    draft = probe("unpatched")["drafts"]["w4a16_fp8_target_bf16_mtp"]
    assert (
        draft["quant_methods"][f"{DRAFT_LAYER}.mtp_block.ffn.experts"]
        == "CompressedTensorsWNA16MarlinMoEMethod"
    )
    assert draft["load"] == {
        "error_type": "KeyError",
        "error": f"'{DRAFT_LAYER}.mtp_block.ffn.experts.w13_weight'",
    }


def test_unpatched_fp8_target_casts_a_bf16_mtp_layer_into_fp8_silently(probe):
    draft = probe("unpatched")["drafts"]["fp8_target_bf16_mtp"]
    assert draft["quant_methods"][f"{DRAFT_LAYER}.mtp_block.attn.wo_a"] == "CompressedTensorsLinearMethod"
    assert draft["wo_a_weight_dtype"] == "torch.float8_e4m3fn"
    assert draft["load"] == "ok"


def test_patched_fp8_wo_a_without_scale_fails_at_load_naming_it(probe):
    load = probe("patched")["drafts"]["fp8_wo_a_unscaled"]["load"]
    assert load["error_type"] == "ValueError"
    wo_a_scale = f"{DRAFT_LAYER}.mtp_block.attn.wo_a.weight_scale"
    assert load["error"].startswith(f"1 MTP draft parameter(s) received no checkpoint tensor: {wo_a_scale}.")


def test_unpatched_fp8_wo_a_without_scale_loads_silently(probe):
    assert probe("unpatched")["drafts"]["fp8_wo_a_unscaled"]["load"] == "ok"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("fp8_without_scale", "FP8 weight without weight_scale_inv or weight_scale"),
        ("uint8", "weight dtype torch.uint8"),
    ],
)
def test_patched_o_proj_refuses_a_wo_a_it_cannot_read_naming_the_layer(probe, case, message):
    refusal = probe("patched")["scale_name"][case]
    assert refusal["error_type"] == "ValueError"
    assert refusal["error"].startswith(f"{DRAFT_LAYER}.mtp_block.attn.wo_a: {message}")
