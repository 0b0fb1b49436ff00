"""Patches 0002 and 0005 (v0.22.1: 0002 and 0004), at start-up: `draft_quant_config` in
--speculative-config, resolved from the checkpoint's headers, and "mtp" refused on checkpoints without
MTP layers.

Every scenario is resolved by vLLM's real SpeculativeConfig in one probe process per vLLM variant.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from tests.probes.mtp_vllm import INT8_W8A8_QUANTIZATION_CONFIG

PROBE = "speculative_config"
MTP = {"method": "mtp", "num_speculative_tokens": 2}
OPTIONS = {
    "auto": "auto",
    "target": "target",
    "unquantized": "unquantized",
    "checkpoint": {"checkpoint": INT8_W8A8_QUANTIZATION_CONFIG},
}
BAD_OPTIONS = {
    "unknown-name": ("bf16", ["'auto'", "'target'", "'unquantized'"]),
    # The mode words of earlier series: Python's None is the only "none" now.
    "none": ("none", ["'auto'", "'target'", "'unquantized'"]),
    "bare-quantization-config": (INT8_W8A8_QUANTIZATION_CONFIG, ["under 'checkpoint'"]),
    "unknown-method": (
        {"checkpoint": {"quant_method": "not-a-method"}},
        ["draft_quant_config.checkpoint", "not-a-method", "compressed-tensors", "fp8"],
    ),
    "bad-fields": (
        {"checkpoint": {"quant_method": "compressed-tensors", "config_groups": 7}},
        ["draft_quant_config.checkpoint", "compressed-tensors"],
    ),
}
MTP_TENSOR_PREFIX = "model.mtp_layers."
# vLLM's online quantization for the BF16 MTP layer, in both forms (names both releases have): the v0.33.0
# series (0010) builds the draft with it, the v0.22.1 series refuses it.
ONLINE_OPTIONS = {
    "online-shorthand": {"online": "int8_per_channel_weight_only"},
    "online-config": {"online_config": {"moe": "int8_per_channel_weight_only"}},
}


def _without_mtp_field(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    del config["num_nextn_predict_layers"]
    (checkpoint / "config.json").write_text(json.dumps(config))


def _without_mtp_tensors(checkpoint):
    tensors = load_file(checkpoint / "model.safetensors")
    main = {name: tensor for name, tensor in tensors.items() if not name.startswith(MTP_TENSOR_PREFIX)}
    save_file(main, checkpoint / "model.safetensors")


def _with_mtp_file_missing(checkpoint):
    """A sharded release whose index still names model_mtp.safetensors, which was not shipped."""
    tensors = load_file(checkpoint / "model.safetensors")
    weight_map = {
        name: "model_mtp.safetensors" if name.startswith(MTP_TENSOR_PREFIX) else "model.safetensors"
        for name in tensors
    }
    _without_mtp_tensors(checkpoint)
    index = {"metadata": {}, "weight_map": weight_map}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))


def _with_truncated_header(checkpoint):
    with open(checkpoint / "model.safetensors", "r+b") as file:
        file.truncate(20)


# scenario: (damage, words the patched error names, stock vLLM's reaction: None = starts anyway)
DAMAGED = {
    "no-mtp-field": (
        _without_mtp_field,
        ["declares none", "num_nextn_predict_layers"],
        "integer modulo by zero",
    ),
    "no-mtp-tensors": (_without_mtp_tensors, ["no tensor in", "model.mtp_layers.*"], None),
    "mtp-file-missing": (_with_mtp_file_missing, ["model_mtp.safetensors", "model.mtp_layers.0."], None),
    "truncated-header": (_with_truncated_header, ["model.safetensors", "20-byte file"], None),
}


@pytest.fixture(scope="module")
def verdicts(vllm_probe, engineered_checkpoint, tmp_path_factory):
    """`verdicts(variant)[scenario]`: SpeculativeConfig's verdict for every scenario of this file."""
    scenarios = {
        f"{quant}-{name}": [str(engineered_checkpoint(quant)), {**MTP, "draft_quant_config": option}]
        for quant in ("bf16", "int8_w8a8", "w4a16")
        for name, option in OPTIONS.items()
    }
    for name, option in ONLINE_OPTIONS.items():
        scenarios[name] = [str(engineered_checkpoint("int8_w8a8")), {**MTP, "draft_quant_config": option}]
    for name, (option, _) in BAD_OPTIONS.items():
        scenarios[name] = [str(engineered_checkpoint("int8_w8a8")), {**MTP, "draft_quant_config": option}]
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "draft_quant_config": "unquantized"}
    scenarios["ngram-with-option"] = [str(engineered_checkpoint("bf16")), ngram]
    for name, (damage, _, _) in DAMAGED.items():
        checkpoint = tmp_path_factory.mktemp(name)
        for file in engineered_checkpoint("int8_w8a8").iterdir():
            (checkpoint / file.name).write_bytes(file.read_bytes())
        damage(checkpoint)
        scenarios[name] = [str(checkpoint), MTP]
    argument = json.dumps(scenarios)
    return lambda variant: vllm_probe(PROBE, variant, argument)["verdicts"]


def test_unpatched_vllm_has_no_draft_quant_config(verdicts):
    for option in OPTIONS:
        assert "draft_quant_config" in verdicts("unpatched")[f"int8_w8a8-{option}"]["error"]


@pytest.mark.parametrize("quant", ["int8_w8a8", "w4a16"])
def test_auto_builds_a_bf16_mtp_block_unquantized_and_logs_its_evidence(verdicts, quant):
    verdict = verdicts("patched")[f"{quant}-auto"]
    assert verdict["decision"] == "unquantized"
    [line] = [line for line in verdict["log"] if "draft_quant_config=auto" in line]
    assert "model.mtp_layers.0.*" in line and "0 quantized" in line and "draft unquantized" in line


def test_auto_leaves_an_unquantized_checkpoint_to_the_target(verdicts):
    assert verdicts("patched")["bf16-auto"]["decision"] == "target"


@pytest.mark.parametrize("option", ["target", "unquantized"])
def test_explicit_choices_are_taken_as_given(verdicts, option):
    assert verdicts("patched")[f"int8_w8a8-{option}"]["decision"] == option


def test_the_mtp_layers_stored_format_is_accepted_for_the_draft(verdicts, series_design):
    verdict = verdicts("patched")["int8_w8a8-checkpoint"]
    # The v0.22.1 series' decision object decides between the target's config and none only.
    assert "error" not in verdict
    assert verdict["decision"] == (None if series_design == "v0.22.1" else "checkpoint")


@pytest.mark.parametrize("scenario", ONLINE_OPTIONS)
def test_online_quantization_of_the_draft_as_the_series_offers_it(verdicts, series_design, scenario):
    assert "draft_quant_config" in verdicts("unpatched")[scenario]["error"]
    verdict = verdicts("patched")[scenario]
    if series_design == "v0.22.1":
        assert "online quantization of the MTP draft needs vLLM 0.32" in verdict["error"]
        assert f"draft_quant_config.{next(iter(ONLINE_OPTIONS[scenario]))}" in verdict["error"]
        return
    assert verdict["decision"] == "online"
    [line] = [line for line in verdict["log"] if "OnlineQuantizationConfig" in line]
    assert "moe: int8_per_channel_static" in line and "8 MTP modules stored unquantized" in line


def test_the_choice_is_part_of_the_config_hash(verdicts):
    hashes = {option: verdicts("patched")[f"int8_w8a8-{option}"]["hash"] for option in OPTIONS}
    assert len(set(hashes.values())) == len(hashes), hashes


@pytest.mark.parametrize("scenario", BAD_OPTIONS)
def test_bad_values_are_refused_with_the_valid_ones(verdicts, scenario):
    error = verdicts("patched")[scenario]["error"]
    assert "draft_quant_config" in error
    for word in BAD_OPTIONS[scenario][1]:
        assert word in error


def test_only_mtp_takes_a_draft_quant_config(verdicts):
    assert "only applies to method 'mtp'" in verdicts("patched")["ngram-with-option"]["error"]


@pytest.mark.parametrize("scenario", DAMAGED)
def test_unpatched_vllm_starts_mtp_without_mtp_layers_or_fails_obscurely(verdicts, scenario):
    verdict, old_error = verdicts("unpatched")[scenario], DAMAGED[scenario][2]
    if old_error is None:
        assert "error" not in verdict and verdict["method"] == "mtp"
    else:
        assert verdict["error"] == old_error


@pytest.mark.parametrize("scenario", DAMAGED)
def test_mtp_without_mtp_layers_is_refused_naming_what_is_missing(verdicts, scenario):
    error = verdicts("patched")[scenario]["error"]
    assert "speculative method 'mtp'" in error
    for word in DAMAGED[scenario][1]:
        assert word in error
