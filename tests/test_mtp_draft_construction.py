"""MTP drafters that cannot run on this CPU (DeepSeek-V4, DeepSeek-V3, Qwen3-Next, Step-3.5) build their
linears with the quant method the checkpoint's MTP tensors call for.

The ``construction`` section of tests/probes/mtp_drafts.py builds each draft the way the proposer does,
from tiny checkpoints whose compressed-tensors config (INT8 W8A8; FP8 block for DeepSeek-V4) describes
the main model while the MTP layer is stored in BF16, quantized, or with quantized projections around
a BF16 decoder block.
"""

from __future__ import annotations

import pytest

SECTION = "construction"
QUANTIZED = "CompressedTensorsLinearMethod"
# What an unquantized draft's modules report; "torch.nn.Linear" is a plain torch Linear (some
# drafters' eh_proj), which never takes a quant method.
UNQUANTIZED = {
    "UnquantizedLinearMethod",
    "UnquantizedFusedMoEMethod",
    "UnquantizedEmbeddingMethod",
    "torch.nn.Linear",
}


def _names(prefix: str, *names: str) -> set[str]:
    return {f"{prefix}.{name}" for name in names}


# Draft modules a quantized MTP layer quantizes: (the MTP layer's own projections, its decoder block).
# Routed experts, routers and heads stay unquantized (BF16 and ignored in every checkpoint).
QUANTIZED_LINEARS = {
    "deepseek_v4": (
        _names("model.layers.2", "e_proj", "h_proj"),
        _names("model.layers.2.mtp_block.attn", "fused_wqa_wkv", "wq_b", "wo_a", "wo_b")
        | _names("model.layers.2.mtp_block.ffn.shared_experts", "gate_up_proj", "down_proj"),
    ),
    # DeepSeek-V3 and Step-3.5 build eh_proj as a plain torch Linear: no projection is quantized.
    "deepseek_v3": (
        set(),
        _names("model.layers.1.mtp_block.self_attn", "fused_qkv_a_proj", "q_b_proj", "kv_b_proj", "o_proj")
        | _names("model.layers.1.mtp_block.mlp.shared_experts", "gate_up_proj", "down_proj"),
    ),
    "qwen3_next": (
        {"model.fc"},
        _names("model.layers.0.self_attn", "qkv_proj", "o_proj")
        | _names("model.layers.0.mlp.shared_expert", "gate_up_proj", "down_proj"),
    ),
    "step3p5": (
        set(),
        _names("model.layers.1.mtp_block.self_attn", "qkv_proj", "o_proj")
        | _names("model.layers.1.mtp_block.mlp", "gate_up_proj", "down_proj"),
    ),
}
PROBED_ARCHITECTURES = sorted(QUANTIZED_LINEARS)
SCENARIOS = ("bf16", "quantized", "bf16_block")

# Quantized projections around a BF16 decoder block, per series. v0.22.1 builds the block with its own
# quant config (its patch 0002) and only the projections quantized; v0.33.0 builds the whole draft with
# one quant config and refuses the layout when draft_quant_config is resolved, naming both parts.
SPLIT_LAYOUT_DECISION = {"v0.22.1": "mtp_layer=target block=unquantized", "v0.33.0": None}
SPLIT_LAYOUT_REFUSAL = (
    "draft_quant_config='auto': the checkpoint stores the MTP layer's",
    "but its decoder block",
)


@pytest.fixture(scope="module")
def draft(mtp_drafts):
    """`draft(variant, architecture, scenario)`: the decision and the quant method of each linear."""
    return lambda variant, architecture, scenario: mtp_drafts(variant)[SECTION][architecture][scenario]


def built(result: dict) -> dict:
    assert "error" not in result, f"draft not built: {result}"
    return result


def quantized_linears(result: dict) -> set[str]:
    return {name for name, method in built(result)["linears"].items() if method == QUANTIZED}


@pytest.mark.parametrize("architecture", PROBED_ARCHITECTURES)
def test_patched_draft_of_a_bf16_mtp_layer_is_unquantized(draft, architecture):
    result = built(draft("patched", architecture, "bf16"))
    projections, block = QUANTIZED_LINEARS[architecture]
    assert result["draft_quant_decision"] == "unquantized"
    assert projections | block <= set(result["linears"])
    assert set(result["linears"].values()) <= UNQUANTIZED, result["linears"]


@pytest.mark.parametrize("architecture", PROBED_ARCHITECTURES)
def test_patched_draft_of_a_quantized_mtp_layer_keeps_the_target_quantization(draft, architecture):
    result = built(draft("patched", architecture, "quantized"))
    projections, block = QUANTIZED_LINEARS[architecture]
    assert result["draft_quant_decision"] == "target"
    assert quantized_linears(result) == projections | block


@pytest.mark.parametrize("architecture", PROBED_ARCHITECTURES)
def test_patched_quantized_projections_around_a_bf16_block_follow_the_series_rule(
    draft, series_design, architecture
):
    result = draft("patched", architecture, "bf16_block")
    decision = SPLIT_LAYOUT_DECISION[series_design]
    if decision is None:
        assert result["error_type"] == "ValidationError", result
        assert all(part in result["error"] for part in SPLIT_LAYOUT_REFUSAL), result["error"]
        return
    projections, _ = QUANTIZED_LINEARS[architecture]
    assert built(result)["draft_quant_decision"] == decision
    assert quantized_linears(result) == projections


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("architecture", PROBED_ARCHITECTURES)
def test_unpatched_draft_quantizes_the_mtp_layer_whatever_its_checkpoint_stores(
    draft, architecture, scenario
):
    result = draft("unpatched", architecture, scenario)
    projections, block = QUANTIZED_LINEARS[architecture]
    assert result["draft_quant_decision"] is None
    assert quantized_linears(result) == projections | block
