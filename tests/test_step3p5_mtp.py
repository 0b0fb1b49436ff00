"""Step-3.5: the MTP draft of a ModelOpt NVFP4 checkpoint whose MTP block is BF16 (seed 002) or NVFP4,
and of compressed-tensors INT8 checkpoints (their KV-cache scales, a quantized MTP head), built and
loaded.

The ``step3p5`` section of tests/probes/mtp_drafts.py writes tiny Step3p5ForCausalLM checkpoints with
ModelOpt's NVFP4 quantization_config or a compressed-tensors INT8 W8A8 one and only the tensors the
draft loads, builds the draft the way the proposer does with draft_quant_config "auto", "target" or
"unquantized", and loads it through the engine's default loader. Only the NVFP4 GEMM kernel choice is stood
in for (vLLM has none for CPU).

ModelOpt never quantizes an embedding, and the probe's NVFP4 checkpoints exclude the MTP head, so
the MTP layer's shared_head.head, eh_proj (a plain torch Linear) and embed_tokens stay unquantized
whatever the decision: only the decoder block follows the checkpoint.
"""

from __future__ import annotations

import pytest

from tests.probing import without_mtp_draft_name

SECTION = "step3p5"
MTP_LAYER = "model.layers.1"
MTP_HEAD = f"{MTP_LAYER}.shared_head.head"
# ModelOpt NVFP4's linear method: vLLM 0.32 renamed it.
NVFP4_METHOD = {"v0.22.1": "ModelOptNvFp4LinearMethod", "v0.33.0": "ModelOptLinearMethod"}
INT8 = "CompressedTensorsLinearMethod"
UNQUANTIZED = {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod", "torch.nn.Linear"}
BLOCK_LINEARS = {
    f"{MTP_LAYER}.mtp_block.{name}"
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
}
# Checkpoints may omit KV-cache parameters (scales; compressed-tensors adds zero points); vLLM's
# loaders let them keep their defaults.
KV_CACHE_PARAMETERS = {
    f"{MTP_LAYER}.mtp_block.self_attn.attn.{name}"
    for name in (
        "k_scale",
        "v_scale",
        "q_scale",
        "prob_scale",
        "k_zero_point",
        "v_zero_point",
        "q_zero_point",
    )
}
NVFP4_SCALES = ("input_scale", "weight_scale", "weight_scale_2")
KV_CACHE_SCALES_MISSING = f"Some parameters like {MTP_LAYER}.mtp_block.self_attn.attn."

# How stock vLLM builds the MTP head of a checkpoint that quantized it, and the load that follows:
# 0.22.1 builds the head without a name (no quant config entry can reach it), so its scale has no
# parameter; since 0.27.1 the head has its name (upstream #48883) and the load stops, as for every
# compressed-tensors checkpoint, at the KV-cache scales.
STOCK_QUANTIZED_HEAD = {
    "v0.22.1": ("UnquantizedEmbeddingMethod", "KeyError", f"'{MTP_HEAD}.weight_scale'"),
    "v0.33.0": (INT8, "RuntimeError", KV_CACHE_SCALES_MISSING),
}


@pytest.fixture(scope="module")
def run(mtp_drafts):
    """`run(variant, name)`: the draft of one probe run (see RUNS in the probe), built."""

    def built(variant: str, name: str) -> dict:
        result = mtp_drafts(variant)[SECTION]["runs"][name]
        assert "build" not in result, f"{name} draft not built: {result['build']}"
        return result

    return built


@pytest.fixture(scope="module")
def nvfp4(series_design) -> str:
    return NVFP4_METHOD[series_design]


@pytest.fixture(scope="module")
def hf_config(mtp_drafts):
    """The probe checkpoints' config.json (a constant of the probe, the same under both variants)."""
    return mtp_drafts("patched")[SECTION]["hf_config"]


# The block's attention layer, described with its KV-cache method: no weight of the checkpoint.
MTP_ATTENTION = f"{MTP_LAYER}.mtp_block.self_attn.attn"


def methods_outside_block(built: dict) -> set[str]:
    """Quant methods of the draft's embeddings, eh_proj and head."""
    block = BLOCK_LINEARS | {MTP_ATTENTION}
    return {method for name, method in built["linears"].items() if name not in block}


def block_methods(built: dict) -> set[str]:
    return {built["linears"][name] for name in BLOCK_LINEARS}


def unloaded(built: dict) -> set[str]:
    """The parameters of a draft that loaded which no checkpoint tensor reached."""
    assert built["load"] == "ok", built["load"]
    return set(built["unloaded"])


def gate_shard_shapes(hf_config: dict) -> list[list[int]]:
    """(NVFP4 parameter shard, BF16 checkpoint tensor) of gate_proj: two FP4 values a byte."""
    intermediate, hidden = hf_config["intermediate_size"], hf_config["hidden_size"]
    return [[intermediate, hidden // 2], [intermediate, hidden]]


def test_patched_draft_of_a_bf16_mtp_block_is_unquantized_and_loads_every_parameter(run):
    built = run("patched", "bf16+auto")
    assert built["draft_quant_decision"] == "unquantized"
    assert BLOCK_LINEARS | {MTP_HEAD} <= set(built["linears"])
    assert set(built["linears"].values()) <= UNQUANTIZED, built["linears"]
    assert unloaded(built) == set()


def test_patched_draft_of_an_nvfp4_mtp_block_keeps_modelopt_nvfp4_and_loads(run, nvfp4):
    built = run("patched", "nvfp4+auto")
    # The survey finds NVFP4 block linears (and BF16 eh_proj and head, which it takes as no evidence).
    assert built["draft_quant_decision"] == "target"
    assert block_methods(built) == {nvfp4}
    assert methods_outside_block(built) <= UNQUANTIZED, built["linears"]
    assert unloaded(built) <= KV_CACHE_PARAMETERS


def test_patched_target_on_a_bf16_mtp_block_fails_naming_the_tensor_it_would_cast(run, nvfp4):
    """Forcing the target's NVFP4 onto a BF16 block: the first BF16 tensor, down_proj's (it sorts
    first), would be cast into its packed NVFP4 parameter (stock vLLM does so without a word, below):
    the series refuses it, naming the parameter, how its layer was built and the tensor."""
    built = run("patched", "bf16+target")
    assert block_methods(built) == {nvfp4}
    load = built["load"]
    assert load["error_type"] == "ValueError"
    error = without_mtp_draft_name(load["error"])
    parameter = f"{MTP_LAYER}.mtp_block.mlp.down_proj.weight"
    assert error.startswith(f"MTP draft parameter {parameter} (torch.uint8) "), error
    assert f"built by {nvfp4}" in error
    assert f"would load checkpoint tensor {MTP_LAYER}.mlp.down_proj.weight (torch.bfloat16, " in error
    assert "draft_quant_config" in error


def test_patched_unquantized_on_an_nvfp4_mtp_block_fails_naming_an_nvfp4_scale(run):
    """An unquantized draft has no parameter for the NVFP4 scales, which sort before the packed
    weights: Step3p5MTP's KeyError names the first one, and the series names the checkpoint tensor the
    load stopped at and what decided the draft's quantization (0004, v0.22.1's 0003)."""
    built = run("patched", "nvfp4+unquantized")
    assert set(built["linears"].values()) <= UNQUANTIZED, built["linears"]
    load = built["load"]
    assert load["error_type"] == "ValueError" and "loading stopped at checkpoint tensor" in load["error"]
    tensor = load["error"].partition("on KeyError: '")[2].partition("'")[0]
    assert tensor.startswith(f"{MTP_LAYER}.mtp_block."), load["error"]
    assert tensor.rpartition(".")[2] in NVFP4_SCALES
    assert "draft_quant_config='unquantized' decides the" in load["error"], load["error"]


def test_unpatched_bf16_mtp_block_fails_with_seed_002s_shape_assertion(run, nvfp4, hf_config):
    """Stock vLLM builds the BF16 block as NVFP4 and asserts param (..., N/2) == loaded (..., N) on
    gate_up_proj, as seed 002 reports for Step-3.7-Flash ((11264, 2048) vs (11264, 4096))."""
    built = run("unpatched", "bf16+auto")
    assert block_methods(built) == {nvfp4}
    load = built["load"]
    assert (load["error_type"], load["error"]) == ("AssertionError", "")
    assert load["parameter"] == f"{MTP_LAYER}.mtp_block.mlp.gate_up_proj.weight"
    assert [load["param_shape"], load["loaded_shape"]] == gate_shard_shapes(hf_config)


def test_unpatched_bf16_down_proj_fills_its_packed_nvfp4_parameter_without_error(run):
    """Row-parallel loaders narrow the checkpoint tensor to the parameter's (packed) input width, so
    under stock vLLM the BF16 down_proj, which sorts before gate_proj, is cast into half its NVFP4
    parameter with no assertion: only the column-parallel linears stop such a load."""
    load = run("unpatched", "bf16+auto")["load"]
    assert f"{MTP_LAYER}.mtp_block.mlp.down_proj.weight" in load["loaded_before"]


def test_unpatched_vllm_loads_an_nvfp4_mtp_block(run, nvfp4):
    """Stock vLLM handles a checkpoint whose MTP block really is NVFP4: seed 002 is BF16-only."""
    built = run("unpatched", "nvfp4+auto")
    assert block_methods(built) == {nvfp4}
    assert unloaded(built) <= KV_CACHE_PARAMETERS


def test_unpatched_vllm_has_no_draft_quant_config(mtp_drafts):
    assert set(mtp_drafts("unpatched")[SECTION]["runs"]) == {
        "bf16+auto",
        "nvfp4+auto",
        "int8+auto",
        "int8_with_head+auto",
    }


@pytest.mark.parametrize("name", ["int8+auto", "int8_with_head+auto"])
def test_patched_draft_of_an_int8_mtp_block_loads(run, name):
    built = run("patched", name)
    assert block_methods(built) == {INT8}
    assert unloaded(built) <= KV_CACHE_PARAMETERS


def test_unpatched_int8_mtp_block_fails_on_its_kv_cache_scales(run):
    """Stock Step3p5MTP lets only requires_grad=False KV-cache scales go unloaded; compressed-tensors
    builds them with requires_grad=True (and adds zero points)."""
    load = run("unpatched", "int8+auto")["load"]
    assert load["error_type"] == "RuntimeError"
    assert load["error"].startswith(KV_CACHE_SCALES_MISSING)
    assert "are not in the checkpoint" in load["error"]


def test_patched_head_is_quantized_when_the_checkpoint_quantized_it(run):
    """The quantizer's target for the MTP head reaches the draft's head under its name."""
    assert run("patched", "int8_with_head+auto")["linears"][MTP_HEAD] == INT8


def test_unpatched_head_of_a_quantized_head_is_built_and_loaded_as_the_release_can(run, series_design):
    built = run("unpatched", "int8_with_head+auto")
    method, error_type, error_start = STOCK_QUANTIZED_HEAD[series_design]
    assert built["linears"][MTP_HEAD] == method
    assert built["load"]["error_type"] == error_type
    assert built["load"]["error"].startswith(error_start)
