"""Issue 3, construction: MTP drafters that cannot run on this CPU build their linears with the quant
method the checkpoint's MTP tensors call for (patches 0002-0005).

tests/probes/mtp_draft_construction.py builds each draft the way the proposer does, from tiny
checkpoints whose compressed-tensors INT8 W8A8 config describes the main model while the MTP layer is
stored in BF16, in INT8, or with INT8 projections around a BF16 decoder block. Every scenario of
every architecture is built in one probe process per vLLM variant.
"""

from __future__ import annotations

import pytest

PROBE = "mtp_draft_construction"
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


# Draft modules an INT8 MTP layer quantizes: (the MTP layer's own projections, its decoder block).
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
ARCHITECTURES = sorted(QUANTIZED_LINEARS)
SCENARIOS = ("bf16", "int8_w8a8", "bf16_block")


@pytest.fixture(scope="module")
def draft(vllm_probe):
    """`draft(variant, architecture, scenario)`: the decision and the quant method of each linear."""

    def built(variant: str, architecture: str, scenario: str) -> dict:
        result = vllm_probe(PROBE, variant)["drafts"][architecture][scenario]
        assert "error" not in result, f"{architecture} {scenario} draft not built: {result}"
        return result

    return built


def quantized_linears(built: dict) -> set[str]:
    return {name for name, method in built["linears"].items() if method == QUANTIZED}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_patched_draft_of_a_bf16_mtp_layer_is_unquantized(draft, architecture):
    built = draft("patched", architecture, "bf16")
    projections, block = QUANTIZED_LINEARS[architecture]
    assert built["draft_quant_decision"] == {"mtp_layer": "none", "block": "none"}
    assert projections | block <= set(built["linears"])
    assert set(built["linears"].values()) <= UNQUANTIZED, built["linears"]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_patched_draft_of_an_int8_mtp_layer_keeps_the_target_quantization(draft, architecture):
    built = draft("patched", architecture, "int8_w8a8")
    projections, block = QUANTIZED_LINEARS[architecture]
    assert built["draft_quant_decision"] == {"mtp_layer": "inherit", "block": "inherit"}
    assert quantized_linears(built) == projections | block


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_patched_draft_builds_a_bf16_decoder_block_unquantized_around_int8_projections(draft, architecture):
    built = draft("patched", architecture, "bf16_block")
    projections, _ = QUANTIZED_LINEARS[architecture]
    assert built["draft_quant_decision"] == {"mtp_layer": "inherit", "block": "none"}
    assert quantized_linears(built) == projections


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_unpatched_draft_quantizes_the_mtp_layer_whatever_its_checkpoint_stores(
    draft, architecture, scenario
):
    built = draft("unpatched", architecture, scenario)
    projections, block = QUANTIZED_LINEARS[architecture]
    assert quantized_linears(built) == projections | block
