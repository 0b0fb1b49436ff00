"""Patch 0001: DeepSeek-V4 MTP e_proj/h_proj get prefixes and honour checkpoint ignore entries."""

from __future__ import annotations

import pytest

PROBE = "dsv4_mtp_quant_prefixes"
SCENARIOS = ("exact_names", "whole_block_regex")
PROJECTIONS = ("e_proj", "h_proj")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_unpatched_draft_quantizes_the_bf16_projections_under_a_blank_name(vllm_probe, scenario):
    built = vllm_probe(PROBE, "unpatched")[scenario]
    for projection in PROJECTIONS:
        assert built[projection]["prefix"] == ""
        assert built[projection]["quant_method"] == "CompressedTensorsLinearMethod"
        assert built[projection]["weight_dtype"] == "torch.int8"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_patched_draft_builds_ignored_projections_unquantized_under_their_names(vllm_probe, scenario):
    built = vllm_probe(PROBE, "patched")[scenario]
    for projection in PROJECTIONS:
        assert built[projection]["prefix"] == f"model.layers.2.{projection}"
        assert built[projection]["quant_method"] == "UnquantizedLinearMethod"
        assert built[projection]["weight_dtype"] == "torch.bfloat16"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_patched_draft_leaves_the_shared_target_quant_config_untouched(vllm_probe, scenario):
    built = vllm_probe(PROBE, "patched")[scenario]
    assert built["target_quant_config_is_shared"] and built["target_ignore_unchanged"]
