"""DeepSeek-V4 MTP on quantized checkpoints whose MTP layer is BF16: the draft is built unquantized and
fully loaded, and its attention output projection takes the BF16 wo_a path.

The ``dsv4`` section of tests/probes/mtp_drafts.py checks the BF16 wo_a projection against float64 on
fresh random inputs, builds and loads DeepSeek-V4 MTP drafts from tiny checkpoints as CUDA builds them
and as the default loader loads them, and runs the MTP block's o_proj with only the CUDA kernels stood
in for. The BF16 path is the v0.22.1 series' (patch 0005) there and upstream's on vLLM 0.32+
(models/deepseek_v4/nvidia/ops/o_proj.py), where stock vLLM has it too.
"""

from __future__ import annotations

import pytest

from tests.probing import without_mtp_draft_name

SECTION = "dsv4"
DRAFT_LAYER = "model.layers.2"
WO_A = f"{DRAFT_LAYER}.mtp_block.attn.wo_a"
# Relative Frobenius error allowed for BF16 inputs and output.
BF16_TOLERANCE = 1e-2
# The MTP layer's linears and experts, plus its head, as the draft names them (vLLM 0.32+ nests the
# routed experts one module deeper, ``experts.routed_experts``).
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
ROUTED_EXPERTS = f"{DRAFT_LAYER}.mtp_block.ffn.experts"
UNQUANTIZED = {"UnquantizedLinearMethod", "UnquantizedFusedMoEMethod", "UnquantizedEmbeddingMethod"}
# The proposer gives the draft the target's embedding; the MTP checkpoint has none.
SHARED_WITH_TARGET = ["model.embed_tokens.weight"]
# Checkpoints whose MTP layer is BF16 (see DRAFT_SCENARIOS in the probe).
BF16_MTP = ("w4a16_fp8_target_bf16_mtp", "fp8_target_bf16_mtp", "fp8_target_ignoring_bf16_mtp")
FP8_MTP = {"fp8_weight_scale": "weight_scale", "fp8_weight_scale_inv": "weight_scale_inv"}
FP8_KERNELS = ["inverse_rope_fp8_quant", "fp8_einsum"]
MISSING_WEIGHT_SCALE_INV = {
    "error_type": "AttributeError",
    "error": "'ColumnParallelLinear' object has no attribute 'weight_scale_inv'",
}
BF16_PATH = "bf16 path"

# Per series. v0.22.1 is the series' own BF16 o_proj (stock vLLM 0.22.1 reads every wo_a as FP8 with
# weight_scale_inv); vLLM 0.32+ has upstream's, which reads either scale name. vLLM 0.22.1
# torch.compiles DeepSeek-V4's forward with full graphs; 0.32 runs it eagerly.
STOCK_HAS_BF16_WO_A = {"v0.22.1": False, "v0.33.0": True}
VLLM_COMPILES_DEEPSEEK_V4 = {"v0.22.1": True, "v0.33.0": False}
# The o_proj of stock vLLM on a BF16 MTP layer ignored by its draft index (seed 004), and on a
# compressed-tensors FP8 wo_a (scale named weight_scale).
STOCK_O_PROJ_OF_IGNORED_BF16_LAYER = {"v0.22.1": MISSING_WEIGHT_SCALE_INV, "v0.33.0": BF16_PATH}
STOCK_O_PROJ_OF_WEIGHT_SCALE = {
    "v0.22.1": MISSING_WEIGHT_SCALE_INV,
    "v0.33.0": {"fp8_kernels": FP8_KERNELS, "fp8_scale": "weight_scale"},
}
# How the patched loader names an FP8 wo_a whose scale the checkpoint lacks (v0.22.1: its own check,
# patch 0003; v0.33.0: the loader's weight tracking made strict for MTP drafts, patch 0004).
UNSCALED_WO_A_ERROR = {
    "v0.22.1": f"1 MTP draft parameter(s) received no checkpoint tensor: {WO_A}.weight_scale.",
    "v0.33.0": f"Following weights were not initialized from checkpoint: {{'{WO_A}.weight_scale'}}.",
}
# Whether a wo_a the o_proj cannot read (FP8 without a scale, a packed uint8 weight) is refused when
# the model is built: the v0.22.1 series' rule (patch 0005); not ported to the v0.33.0 series.
REFUSES_UNREADABLE_WO_A_AT_BUILD = {"v0.22.1": True, "v0.33.0": False}


@pytest.fixture(scope="module")
def probe(mtp_drafts):
    """`probe(variant)`: the section's verdict for that vLLM."""
    return lambda variant: mtp_drafts(variant)[SECTION]


@pytest.fixture(scope="module")
def draft(probe):
    """`draft(variant, scenario)`: a DeepSeek-V4 draft built, loaded and its o_proj run."""

    def result(variant: str, scenario: str) -> dict:
        built = probe(variant)["drafts"][scenario]
        assert "build" not in built, f"{scenario} draft not built: {built['build']}"
        return built

    return result


def o_proj(built: dict) -> dict:
    assert built["load"] == "ok", built["load"]
    return built["after_load"]["o_proj"]


def is_bf16_path(o_proj_run: dict) -> bool:
    return o_proj_run.get("fp8_kernels") == [] and o_proj_run["relative_error"] <= BF16_TOLERANCE


def method_of(linears: dict, module: str) -> str | None:
    """The quant method of a draft module, wherever this release nests it; None unless exactly one."""
    methods = [method for name, method in linears.items() if name == module or name.startswith(f"{module}.")]
    return methods[0] if len(methods) == 1 else None


@pytest.mark.parametrize("shape", ["flash", "flash_ratios"])
def test_bf16_wo_a_projection_matches_float64_and_writes_every_output_element(probe, shape):
    verdict = probe("patched")
    maths = verdict["maths"][shape]
    assert maths["unwritten"] == 0, verdict["seed"]
    assert maths["fp8_kernels"] == []
    assert maths["relative_error"] <= BF16_TOLERANCE, (maths, verdict["seed"])


def test_unpatched_bf16_wo_a_projection_exists_only_upstream(probe, series_design):
    maths = probe("unpatched")["maths"]
    if STOCK_HAS_BF16_WO_A[series_design]:
        assert all(maths[shape]["relative_error"] <= BF16_TOLERANCE for shape in ("flash", "flash_ratios"))
    else:
        assert maths["error_type"] == "ImportError"


@pytest.mark.parametrize("scenario", BF16_MTP)
def test_patched_bf16_wo_a_takes_the_bf16_path_and_matches_float64(draft, series_design, scenario):
    built = draft("patched", scenario)
    run = o_proj(built)
    assert built["after_load"]["wo_a_weight_dtype"] == "torch.bfloat16"
    assert is_bf16_path(run), run
    assert run["compiled_by_vllm"] == VLLM_COMPILES_DEEPSEEK_V4[series_design]
    if run["compiled_by_vllm"]:
        # vLLM compiles the model's forward with full graphs: the path must trace without a break.
        assert run["compiled_equals_eager"] is True


def test_unpatched_bf16_mtp_layer_ignored_by_index_runs_its_o_proj_as_the_release_can(draft, series_design):
    """Seed 004: the MTP layer ignored by its draft index gets a BF16 wo_a, which stock vLLM 0.22.1
    reads as FP8 (AttributeError at the first forward); 0.32 has the BF16 path."""
    built = draft("unpatched", "fp8_target_ignoring_bf16_mtp")
    run = o_proj(built)
    assert built["after_load"]["wo_a_weight_dtype"] == "torch.bfloat16"
    expected = STOCK_O_PROJ_OF_IGNORED_BF16_LAYER[series_design]
    assert (BF16_PATH if is_bf16_path(run) else run) == expected


@pytest.mark.parametrize("scenario", sorted(FP8_MTP))
def test_patched_fp8_wo_a_takes_the_fp8_kernels_with_its_scale(draft, scenario):
    built = draft("patched", scenario)
    assert built["after_load"]["wo_a_weight_dtype"] == "torch.float8_e4m3fn"
    assert o_proj(built) == {"fp8_kernels": FP8_KERNELS, "fp8_scale": FP8_MTP[scenario]}


def test_fp8_path_with_weight_scale_inv_is_unchanged(draft):
    scenario = "fp8_weight_scale_inv"
    assert o_proj(draft("unpatched", scenario)) == o_proj(draft("patched", scenario))


def test_unpatched_fp8_wo_a_with_weight_scale_runs_as_the_release_can(draft, series_design):
    """compressed-tensors FP8 names the block scale weight_scale; stock vLLM 0.22.1 reads
    weight_scale_inv only, 0.32 either."""
    assert o_proj(draft("unpatched", "fp8_weight_scale")) == STOCK_O_PROJ_OF_WEIGHT_SCALE[series_design]


@pytest.mark.parametrize("scenario", BF16_MTP)
def test_patched_bf16_mtp_layer_is_built_unquantized_and_fully_loaded(draft, scenario):
    built = draft("patched", scenario)
    assert built["draft_quant_decision"] == "unquantized"
    methods = {module: method_of(built["linears"], module) for module in MTP_MODULES}
    assert None not in methods.values(), methods
    assert set(built["linears"].values()) <= UNQUANTIZED, built["linears"]
    assert built["load"] == "ok"
    assert built["unloaded"] == SHARED_WITH_TARGET


def test_unpatched_w4a16_target_cannot_load_a_bf16_mtp_layer(draft):
    """Seed 004's KeyError: the experts are built W4A16 and the BF16 expert tensors look for
    w13_weight, which the packed experts do not have."""
    built = draft("unpatched", "w4a16_fp8_target_bf16_mtp")
    assert method_of(built["linears"], ROUTED_EXPERTS).startswith("CompressedTensorsWNA16")
    assert built["load"]["error_type"] == "KeyError"
    assert built["load"]["error"].startswith(f"'{ROUTED_EXPERTS}.")
    assert built["load"]["error"].endswith(".w13_weight'")


def test_unpatched_fp8_target_casts_a_bf16_mtp_layer_into_fp8_and_never_loads_its_scales(draft):
    built = draft("unpatched", "fp8_target_bf16_mtp")
    assert built["linears"][WO_A] == "CompressedTensorsLinearMethod"
    assert built["after_load"]["wo_a_weight_dtype"] == "torch.float8_e4m3fn"
    assert built["load"] == "ok"
    assert f"{WO_A}.weight_scale" in built["unloaded"]


def test_patched_fp8_wo_a_without_scale_fails_at_load_naming_it(draft, series_design):
    load = draft("patched", "fp8_wo_a_unscaled")["load"]
    assert load["error_type"] == "ValueError"
    assert without_mtp_draft_name(load["error"]).startswith(UNSCALED_WO_A_ERROR[series_design])
    assert "draft_quant_config" in load["error"]


def test_unpatched_fp8_wo_a_without_scale_loads_silently(draft):
    built = draft("unpatched", "fp8_wo_a_unscaled")
    assert built["load"] == "ok"
    assert f"{WO_A}.weight_scale" in built["unloaded"]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("fp8_without_scale", "FP8 weight without weight_scale_inv or weight_scale"),
        ("uint8", "weight dtype torch.uint8"),
    ],
)
def test_patched_o_proj_refuses_a_wo_a_it_cannot_read_where_the_series_has_the_rule(
    probe, series_design, case, message
):
    refusal = probe("patched")["scale_name"]
    if not REFUSES_UNREADABLE_WO_A_AT_BUILD[series_design]:
        assert refusal["error_type"] == "ImportError"
        return
    assert refusal[case]["error_type"] == "ValueError"
    assert refusal[case]["error"].startswith(f"{WO_A}: {message}")
