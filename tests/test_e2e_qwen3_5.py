"""Qwen3.5 MTP (dense and MoE, hybrid Gated DeltaNet / full-attention layers) on the real vLLM CPU
engine, stock and with the series, on engineered checkpoints (qwen3_5_checkpoints.py) whose MTP layer
is BF16 in model_mtp.safetensors beside a compressed-tensors INT8 W8A8 or W4A16 target.

The engine runs are the end-to-end suite's (engine_run, e2e_cases.py): stock vLLM's outcome is asserted
on the same checkpoint the series serves at acceptance 1.0 with the target's own greedy output (the
known token chain). The scenarios of seed 000 follow: a quantizer's export without the MTP layer and
its keys, repaired by `python -m mtpq graft` (a) or by hand (b); the dense export is a quantized
fine-tune's too (c). Then the bad input beside an MTP layer: each a clear error of the series, and a
doctor finding, naming the file, key or tensor. Tensor parallelism: test_e2e_tensor_parallel.py.
"""

from __future__ import annotations

import json

import pytest

from tests.commands import run_mtpq
from tests.cpu_features import doctor_platform
from tests.e2e_cases import (
    QWEN3_5_BAD_INPUT,
    QWEN3_5_CASES,
    QWEN3_5_EXPORT,
    QWEN3_5_FAMILIES,
    QWEN3_5_REPAIRED,
    Case,
    EngineRun,
    baseline,
)
from tests.qwen3_5_checkpoints import INDEX_FILE, MTP_CONFIG_KEYS, MTP_FILE
from tests.test_e2e_mtp_acceptance import (
    assert_auto_reaches_the_bf16_acceptance,
    assert_full_acceptance_and_lossless,
    assert_stock_result,
)

# What the series' start-up check answers "mtp" on a config that declares no MTP layer.
DECLARES_NONE = "speculative method 'mtp' needs MTP layers"
# What names each bad input: in the series' error, and in the doctor's verdict or fix.
BAD_INPUT_NAMED = {
    # Loud loading names the parameters of the draft's second layer (built as model.layers.1.*).
    "mtp-layers-overdeclared": (
        ["were not initialized from checkpoint", "model.layers.1."],
        ["text_config.mtp_num_hidden_layers = 2 declares 2 MTP layers", f"{MTP_FILE} holds 1: mtp.layers.0"],
    ),
    "mtp-file-missing": ([f"{INDEX_FILE} maps MTP tensors (e.g. mtp.fc.weight) to {MTP_FILE}"], [MTP_FILE]),
    "mtp-keys-missing": (
        [DECLARES_NONE, "mtp_num_hidden_layers"],
        [f"text_config.{key}" for key in MTP_CONFIG_KEYS],
    ),
}


def doctor_verdicts(checkpoint, version: str) -> dict:
    """`python -m mtpq doctor CKPT --json` on the CPU at the target: its verdicts and fix, exit 1."""
    done = run_mtpq("doctor", checkpoint, "--vllm", version, "--platform", doctor_platform(), "--json")
    assert done.returncode == 1, done.stderr
    return json.loads(done.stdout)["releases"][version]


@pytest.mark.parametrize("family", QWEN3_5_FAMILIES)
def test_qwen3_5_bf16_checkpoint_accepts_every_draft(engine_run, engineered_checkpoint, family):
    case = baseline(family)
    assert_full_acceptance_and_lossless(
        engine_run(EngineRun("patched", case, {})), engineered_checkpoint, case
    )


@pytest.mark.parametrize("case", [*QWEN3_5_CASES, *QWEN3_5_REPAIRED], ids=Case.name)
def test_qwen3_5_stock_fails_where_the_series_accepts_every_draft(
    engine_run, engineered_checkpoint, stock_result, case
):
    assert_stock_result(engine_run(EngineRun("unpatched", case, {})), stock_result(case))
    assert_auto_reaches_the_bf16_acceptance(engine_run, engineered_checkpoint, case)


def test_qwen3_5_export_without_its_mtp_layer_is_diagnosed_and_refused(
    engine_run, engineered_checkpoint, pin, stock_result
):
    """Seed 000's export: stock vLLM drafts from an MTP layer nothing loaded; the series refuses "mtp"
    naming the missing key, and the doctor names the missing file and keys and predicts both."""
    case = QWEN3_5_EXPORT
    checkpoint = engineered_checkpoint(case.quant, case.arch, **case.options)
    assert_stock_result(engine_run(EngineRun("unpatched", case, {})), stock_result(case))
    patched = engine_run(EngineRun("patched", case, {}))
    assert DECLARES_NONE in patched["error"] and "mtp_num_hidden_layers" in patched["error"]

    verdicts = doctor_verdicts(checkpoint, pin.version)
    assert verdicts["stock"]["kind"] == "silent 0 % acceptance"
    assert "drafter builds 1 layer(s)" in verdicts["stock"]["why"]
    assert DECLARES_NONE in verdicts["patched"]["error"]
    (fix,) = verdicts["fix"]
    for missing in [MTP_FILE, *(f"text_config.{key}" for key in MTP_CONFIG_KEYS)]:
        assert missing in fix


@pytest.mark.parametrize("case", QWEN3_5_BAD_INPUT, ids=Case.name)
def test_qwen3_5_bad_input_is_refused_and_diagnosed_naming_it(
    engine_run, engineered_checkpoint, pin, stock_result, case
):
    """More MTP layers declared than stored, an index naming a missing model_mtp.safetensors, the
    file without text_config's keys: stock vLLM's outcome, the series' error and the doctor's finding."""
    assert_stock_result(engine_run(EngineRun("unpatched", case, {})), stock_result(case))
    in_error, in_diagnosis = BAD_INPUT_NAMED[case.options["damage"]]
    patched = engine_run(EngineRun("patched", case, {}))
    assert all(words in patched.get("error", "") for words in in_error), patched

    verdicts = doctor_verdicts(engineered_checkpoint(case.quant, case.arch, **case.options), pin.version)
    assert verdicts["patched"]["kind"] != "works"
    diagnosis = " ".join([verdicts["patched"]["why"], verdicts["patched"]["error"] or "", *verdicts["fix"]])
    assert all(words in diagnosis for words in in_diagnosis), verdicts


def test_graft_restores_the_qwen3_5_mtp_file_index_and_keys(engineered_checkpoint):
    """Scenario a: graft writes a new checkpoint (the export is left as it was) holding the BF16
    release's model_mtp.safetensors, an index mapping its mtp.* tensors, and the nested keys."""
    export = engineered_checkpoint(QWEN3_5_EXPORT.quant, QWEN3_5_EXPORT.arch, **QWEN3_5_EXPORT.options)
    before = {path.name: path.read_bytes() for path in export.iterdir()}
    (grafted_case,) = [case for case in QWEN3_5_REPAIRED if case.options["graft"] == "plain"]
    grafted = engineered_checkpoint(grafted_case.quant, grafted_case.arch, **grafted_case.options)
    assert engineered_checkpoint.grafts[grafted].returncode == 0

    bf16 = engineered_checkpoint("bf16", QWEN3_5_EXPORT.arch)
    bf16_text = json.loads((bf16 / "config.json").read_text())["text_config"]
    text = json.loads((grafted / "config.json").read_text())["text_config"]
    assert {key: text[key] for key in MTP_CONFIG_KEYS} == {key: bf16_text[key] for key in MTP_CONFIG_KEYS}
    weight_map = json.loads((grafted / INDEX_FILE).read_text())["weight_map"]
    bf16_mtp = json.loads((bf16 / INDEX_FILE).read_text())["weight_map"]
    assert {name for name, file in weight_map.items() if file == MTP_FILE} == {
        name for name, file in bf16_mtp.items() if file == MTP_FILE
    }
    assert {path.name: path.read_bytes() for path in export.iterdir()} == before
