"""The families users report 0 % MTP acceptance for, on quantized checkpoints whose MTP layer was left
BF16: Qwen3.5 (and 3.6 / 3.8) under ModelOpt or compressed-tensors NVFP4 and GPTQ / AutoRound INT4,
GLM-4.5-4.7 under FP8 (channel or block), MXFP4 and NVFP4, GLM-4.7-Flash and GLM-5 under FP8 block and
NVFP4 (DeepSeek-V4: tests/test_dsv4_bf16_mtp.py).

The ``families`` section of tests/probes/mtp_drafts.py builds each draft the way the proposer does
and loads it through the engine's default loader; only CUDA-bound kernel choices are stood in for.
The patched draft is unquantized and every parameter receives its checkpoint tensor; stock vLLM builds
the MTP layer with the target's quantization and then fails to load it, or loads it silently with
quantization scales no tensor reached (what drafts at 0 % acceptance).
"""

from __future__ import annotations

import re

import pytest

SECTION = "families"
UNQUANTIZED = {
    "UnquantizedLinearMethod",
    "UnquantizedFusedMoEMethod",
    "UnquantizedEmbeddingMethod",
    "torch.nn.Linear",
}
GLM_MTP_BLOCK = "model.layers.1.mtp_block"


def _names(prefix: str, *names: str) -> set[str]:
    return {f"{prefix}.{name}" for name in names}


_GLM_MOE = _names(
    f"{GLM_MTP_BLOCK}.mlp", "shared_experts.gate_up_proj", "shared_experts.down_proj", "experts"
)
_MLA = _names(f"{GLM_MTP_BLOCK}.self_attn", "fused_qkv_a_proj", "q_b_proj", "kv_b_proj", "o_proj")
# The MTP decoder block's linears and experts as the draft names them: what every format quantizes
# (routed experts are prefix-matched, vLLM 0.32+ nests them one module deeper).
BLOCKS = {
    "qwen3_5": _names(
        "model.layers.0", "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"
    ),
    "glm4_moe": _names(f"{GLM_MTP_BLOCK}.self_attn", "qkv_proj", "o_proj") | _GLM_MOE,
    "glm4_moe_lite": _MLA | _GLM_MOE,
    "glm5": _MLA | {f"{GLM_MTP_BLOCK}.self_attn.indexer.wq_b"} | _GLM_MOE,
}
FORMATS = {
    "qwen3_5": ("modelopt_nvfp4", "ct_nvfp4", "gptq_int4", "autoround_int4"),
    "glm4_moe": ("ct_fp8", "fp8_block", "ct_mxfp4", "modelopt_nvfp4", "ct_nvfp4"),
    "glm4_moe_lite": ("fp8_block", "modelopt_nvfp4", "ct_nvfp4"),
    "glm5": ("fp8_block", "modelopt_nvfp4", "ct_nvfp4"),
}
RUNS = [(family, quantization) for family, formats in FORMATS.items() for quantization in formats]
KV_CACHE_PARAMETER = re.compile(r"\.attn\.(k|v|q|prob)_(scale|zero_point)$")
# The proposer gives the draft the target's embedding and LM head.
SHARED_WITH_TARGET = ("embed_tokens", "lm_head")

# How stock vLLM's load of the BF16 MTP layer ends (0.32 / 0.33; 0.22.1 apart: STOCK_LOAD_OF_RELEASE):
# the error it raises (type, start of message), or
# SILENT: it loads, casting BF16 values into the quantized parameters, whose scales no tensor reaches.
SILENT = ("silent", "")
_PACKED_EXPERTS_HAVE_NO_BF16_WEIGHT = ("KeyError", f"'{GLM_MTP_BLOCK}.mlp.experts.")
# The MTP head is built NVFP4 too, and its BF16 tensor does not fit the packed parameter.
_HEAD_DOES_NOT_FIT = ("RuntimeError", "The size of tensor a (64) must match the size of tensor b (128)")
# The quantized fc has packed parameters only, and Qwen3.5's loader finds none under its BF16 name.
_NO_FC_WEIGHT = (
    "ValueError",
    "There is no module or parameter named 'fc.weight' in Qwen3_5MultiTokenPredictor",
)
STOCK_LOAD = {
    # ModelOpt NVFP4 leaves fc unquantized (upstream's workaround) and asserts on the packed block.
    ("qwen3_5", "modelopt_nvfp4"): ("AssertionError", ""),
    ("qwen3_5", "ct_nvfp4"): _NO_FC_WEIGHT,
    ("qwen3_5", "gptq_int4"): _NO_FC_WEIGHT,
    ("qwen3_5", "autoround_int4"): _NO_FC_WEIGHT,
    ("glm4_moe", "ct_fp8"): SILENT,
    ("glm4_moe", "fp8_block"): SILENT,
    ("glm4_moe", "ct_mxfp4"): _PACKED_EXPERTS_HAVE_NO_BF16_WEIGHT,
    ("glm4_moe", "modelopt_nvfp4"): _HEAD_DOES_NOT_FIT,
    ("glm4_moe", "ct_nvfp4"): _PACKED_EXPERTS_HAVE_NO_BF16_WEIGHT,
    ("glm4_moe_lite", "fp8_block"): SILENT,
    ("glm4_moe_lite", "modelopt_nvfp4"): _HEAD_DOES_NOT_FIT,
    ("glm4_moe_lite", "ct_nvfp4"): _PACKED_EXPERTS_HAVE_NO_BF16_WEIGHT,
    ("glm5", "fp8_block"): SILENT,
    ("glm5", "modelopt_nvfp4"): _HEAD_DOES_NOT_FIT,
    ("glm5", "ct_nvfp4"): _PACKED_EXPERTS_HAVE_NO_BF16_WEIGHT,
}
# Where a release's stock draft ends otherwise. vLLM 0.22.1 loads Qwen3.5's compressed-tensors NVFP4 and
# AutoRound drafts silently, and builds its GPTQ draft unquantized: its GPTQ config quantizes only the
# modules whose tensors the checkpoint stores quantized (safetensors metadata), and the BF16 MTP layer's
# are not.
BUILT_UNQUANTIZED = ("unquantized", "")
STOCK_LOAD_OF_RELEASE = {
    "v0.22.1": {
        ("qwen3_5", "ct_nvfp4"): SILENT,
        ("qwen3_5", "gptq_int4"): BUILT_UNQUANTIZED,
        ("qwen3_5", "autoround_int4"): SILENT,
    },
    "v0.33.0": {},
}


@pytest.fixture(scope="module")
def draft(mtp_drafts):
    """`draft(variant, family, quantization)`: the draft built and loaded."""

    def result(variant: str, family: str, quantization: str) -> dict:
        run = mtp_drafts(variant)[SECTION][family][quantization]
        assert "build" not in run, f"{family} {quantization} draft not built: {run['build']}"
        return run

    return result


def method_of(linears: dict, module: str) -> str | None:
    """The quant method of a draft module, wherever this release nests it; None unless exactly one."""
    methods = [method for name, method in linears.items() if name == module or name.startswith(f"{module}.")]
    return methods[0] if len(methods) == 1 else None


def never_loaded_quantization_parameters(run: dict) -> list[str]:
    """Parameters of the MTP layer's linears and experts that no checkpoint tensor reached (KV-cache
    scales and zero points, which checkpoints may omit, left out)."""
    return [name for name in run["unloaded"] if not KV_CACHE_PARAMETER.search(name)]


@pytest.mark.parametrize(("family", "quantization"), RUNS)
def test_patched_draft_of_a_bf16_mtp_layer_is_unquantized_and_fully_loaded(draft, family, quantization):
    run = draft("patched", family, quantization)
    assert run["draft_quant_decision"] == "unquantized"
    assert None not in {method_of(run["linears"], module) for module in BLOCKS[family]}
    assert set(run["linears"].values()) <= UNQUANTIZED, run["linears"]
    assert run["load"] == "ok", run["load"]
    assert all(name.split(".")[-2] in SHARED_WITH_TARGET for name in run["unloaded"]), run["unloaded"]


@pytest.mark.parametrize(("family", "quantization"), RUNS)
def test_unpatched_draft_of_a_bf16_mtp_layer_is_built_and_loaded_as_the_release_can(
    draft, series_design, family, quantization
):
    """Stock vLLM quantizes the BF16 MTP layer and fails to load it or misloads it, unless
    STOCK_LOAD_OF_RELEASE says that release builds it unquantized."""
    run = draft("unpatched", family, quantization)
    methods = {module: method_of(run["linears"], module) for module in BLOCKS[family]}
    expected = {**STOCK_LOAD, **STOCK_LOAD_OF_RELEASE[series_design]}[family, quantization]
    if expected == BUILT_UNQUANTIZED:
        assert set(methods.values()) <= UNQUANTIZED, methods
        assert run["load"] == "ok" and not never_loaded_quantization_parameters(run), run
        return
    assert UNQUANTIZED.isdisjoint(methods.values()) and None not in methods.values(), methods
    if expected == SILENT:
        assert run["load"] == "ok"
        assert never_loaded_quantization_parameters(run), run["unloaded"]
    else:
        assert run["load"]["error_type"] == expected[0], run["load"]
        assert run["load"]["error"].startswith(expected[1]), run["load"]
