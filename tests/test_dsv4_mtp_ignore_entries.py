"""DeepSeek-V4: the ignore entries a checkpoint writes for its BF16 MTP layer (``mtp.{i}.*``) reach the
MTP draft's modules, which are built as ``model.layers.{num_hidden_layers + i}.*``.

The ``dsv4_ignore_entries`` section of tests/probes/mtp_drafts.py builds the draft as CUDA does from a
compressed-tensors FP8 block config that ignores the MTP layer by exact names or by one pattern, with
no safetensors to survey, so the ignore entries alone decide (draft_quant_config "auto" keeps the
target's config).
"""

from __future__ import annotations

import pytest

SECTION = "dsv4_ignore_entries"
SCENARIOS = ("exact_names", "whole_layer_regex")
PROJECTIONS = ("e_proj", "h_proj")
DRAFT_LAYER = "model.layers.2"
FP8 = {"quant_method": "CompressedTensorsLinearMethod", "weight_dtype": "torch.float8_e4m3fn"}
BF16 = {"quant_method": "UnquantizedLinearMethod", "weight_dtype": "torch.bfloat16"}

# Stock vLLM builds e_proj/h_proj without a prefix up to 0.23 (so no entry can match them), with
# their draft names since 0.24.
STOCK_PROJECTION_PREFIXES = {"v0.22.1": "", "v0.33.0": f"{DRAFT_LAYER}."}
# What the patched draft builds for each way of ignoring the MTP layer. The v0.22.1 series re-keys
# names and whole-layer patterns onto the draft's layer (patch 0001); the v0.33.0 series uses
# upstream's align_mtp_quant_config (patch 0006), which re-keys name prefixes only, so a ``re:``
# pattern written for ``mtp.*`` still misses the draft (its tensors would be surveyed as BF16 and
# the draft built unquantized anyway whenever the checkpoint's headers can be read).
PATCHED_PROJECTIONS = {
    "v0.22.1": {"exact_names": BF16, "whole_layer_regex": BF16},
    "v0.33.0": {"exact_names": BF16, "whole_layer_regex": FP8},
}


@pytest.fixture(scope="module")
def draft(mtp_drafts):
    """`draft(variant, scenario)`: how the draft's projections were built, and the target's ignore list."""

    def result(variant: str, scenario: str) -> dict:
        built = mtp_drafts(variant)[SECTION][scenario]
        assert "error" not in built, f"{scenario} draft not built: {built}"
        return built

    return result


def built_as(projection: dict) -> dict:
    return {key: projection[key] for key in ("quant_method", "weight_dtype")}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_unpatched_draft_quantizes_the_projections_its_checkpoint_ignores(draft, series_design, scenario):
    built = draft("unpatched", scenario)
    for projection in PROJECTIONS:
        prefix = STOCK_PROJECTION_PREFIXES[series_design]
        assert built[projection]["prefix"] == (f"{prefix}{projection}" if prefix else "")
        assert built_as(built[projection]) == FP8


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_patched_draft_builds_the_projections_as_the_ignore_entries_say(draft, series_design, scenario):
    built = draft("patched", scenario)
    for projection in PROJECTIONS:
        assert built[projection]["prefix"] == f"{DRAFT_LAYER}.{projection}"
        assert built_as(built[projection]) == PATCHED_PROJECTIONS[series_design][scenario]


def test_patched_draft_leaves_the_target_config_as_written(draft):
    """Every MTP draft builds from its own copy of the quant config (0009: initialize_model gives it
    one that looks modules up by the checkpoint's names), so whatever a drafter re-keys (DeepSeek-V4's
    align_mtp_quant_config renames ignore entries onto the draft's layer), the target's ignore list
    stays as the checkpoint wrote it."""
    built = draft("patched", "exact_names")
    assert not built["target_quant_config_is_shared"]
    before, after = built["target_ignore_before"], built["target_ignore_after"]
    assert "lm_head" in before and any(entry.startswith("model.mtp.0.") for entry in before)
    assert after == before
