"""MTP on quantized checkpoints with a BF16 MTP block, on the real vLLM CPU engine.

Engineered tiny checkpoints (checkpoints.py) make every draft right exactly when the MTP block's own
weights load correctly, so acceptance tells a working draft (1.0) from a broken one (0.0); and the
main model's greedy output is a known token chain, so comparing the output with that chain proves
MTP lossless without a second engine run. The runs of one vLLM variant share one probe process
(engine_run, conftest.py).
"""

from __future__ import annotations

import pytest

from tests.checkpoints import (
    NUM_HIDDEN_LAYERS,
    damaged_mtp_tensor,
    default_prompts,
    expected_continuation,
    load_successor,
)
from tests.e2e_cases import (
    AS_DEQUANTIZED_REFERENCE,
    BAD_LAYOUTS,
    CASES,
    CHOICE_CASES,
    DRAFTER_BUILDS_FIRST_LAYER_ONLY,
    DRAFTER_MISSING_LAYER_ERROR,
    E2E_FAMILIES,
    MTP_LAYERS_NUMBERED_FROM_ZERO,
    OWN_SCHEME_MTP,
    QUANTIZED_MTP,
    QUANTIZER_EXPORTS,
    SILENT_FAILURE_ACCEPTANCE,
    Case,
    EngineRun,
    baseline,
    drafts_as_reference,
    own_scheme_reference,
)

# What an unquantized draft's modules report; "torch.nn.Linear" is a plain torch Linear (some
# drafters' eh_proj), which never takes a quant method.
UNQUANTIZED = {
    "UnquantizedLinearMethod",
    "UnquantizedFusedMoEMethod",
    "UnquantizedEmbeddingMethod",
    "torch.nn.Linear",
}
# The hint patched vLLM gives when the checkpoint's MTP tensors do not fit the draft it built.
LOUD_LOAD_HINT = "set draft_quant_config in --speculative-config"


def expected_outputs(checkpoint) -> list[list[int]]:
    """The main model's greedy continuation of every prompt: the engineered token chain."""
    successor = load_successor(checkpoint)
    return [expected_continuation(successor, prompt, 32) for prompt in default_prompts()]


def assert_full_acceptance_and_lossless(report: dict, engineered_checkpoint, case: Case) -> None:
    assert "error" not in report, report["error"]
    assert report["draft_tokens"] > 0 and report["acceptance"] == 1.0, report
    checkpoint = engineered_checkpoint(case.quant, case.arch, **case.options)
    assert report["outputs"] == expected_outputs(checkpoint)


def draft_methods(report: dict) -> set[str]:
    """Quant methods of the draft's modules, on every tensor-parallel rank."""
    return {method for rank in report["draft_ranks"] for method in rank["linears"].values()}


def cpu_cannot_run(engine_run, case: Case, report: dict) -> str | None:
    """Where the run with MTP (its report) failed: the error of a run without MTP, when the CPU engine
    cannot run the format at all."""
    if "error" not in report:
        return None
    return engine_run(EngineRun("patched", case)).get("error")


@pytest.mark.parametrize("arch", E2E_FAMILIES)
def test_bf16_checkpoint_accepts_every_draft(engine_run, engineered_checkpoint, arch):
    """The baseline the quantized cases must reach."""
    case = baseline(arch)
    assert_full_acceptance_and_lossless(
        engine_run(EngineRun("patched", case, {})), engineered_checkpoint, case
    )


def assert_stock_result(report: dict, expected: str) -> None:
    """Stock vLLM's run ended as Case.stock says: that acceptance (0.0: silently broken drafts, no more
    than chance matches), or an error with those words."""
    if expected.startswith("acceptance "):
        assert "error" not in report, report["error"]
        assert report["draft_tokens"] > 0
        acceptance = float(expected.removeprefix("acceptance "))
        if acceptance == 0.0:
            assert report["acceptance"] <= SILENT_FAILURE_ACCEPTANCE, report
        else:
            assert report["acceptance"] == acceptance, report
    else:
        assert expected in report.get("error", ""), report


@pytest.mark.parametrize("case", [*CASES, *OWN_SCHEME_MTP, *QUANTIZER_EXPORTS], ids=Case.name)
def test_unpatched_vllm_shows_the_stock_result(
    engine_run, engineered_checkpoint, stock_result, case, record_property
):
    record_property("stock", stock_result(case))  # what the release matrix records of stock
    report = engine_run(EngineRun("unpatched", case, {}))
    if stock_result(case) == AS_DEQUANTIZED_REFERENCE:
        assert_drafts_as_its_dequantized_reference(report, engine_run, engineered_checkpoint, case)
    else:
        assert_stock_result(report, stock_result(case))


def assert_auto_reaches_the_bf16_acceptance(engine_run, engineered_checkpoint, case: Case) -> None:
    report = engine_run(EngineRun("patched", case, {}))
    if case.quant == "w4a16" and (platform_error := cpu_cannot_run(engine_run, case, report)):
        # The engine cannot run this format on this CPU even without MTP: the draft must load
        # and the run get exactly as far as the target alone (stock vLLM fails earlier, loading it).
        assert report["error"] == platform_error
        return
    assert_full_acceptance_and_lossless(report, engineered_checkpoint, case)
    assert draft_methods(report) <= UNQUANTIZED


@pytest.mark.parametrize("case", CASES, ids=Case.name)
def test_auto_reaches_the_bf16_acceptance_losslessly(engine_run, engineered_checkpoint, case):
    assert_auto_reaches_the_bf16_acceptance(engine_run, engineered_checkpoint, case)


@pytest.mark.parametrize("case", CHOICE_CASES, ids=Case.name)
def test_unquantized_builds_the_draft_unquantized(engine_run, engineered_checkpoint, case):
    report = engine_run(EngineRun("patched", case, {"draft_quant_config": "unquantized"}))
    assert_full_acceptance_and_lossless(report, engineered_checkpoint, case)
    assert draft_methods(report) <= UNQUANTIZED


@pytest.mark.parametrize("case", CHOICE_CASES, ids=Case.name)
def test_target_fails_loudly_instead_of_drafting_garbage(engine_run, case):
    report = engine_run(EngineRun("patched", case, {"draft_quant_config": "target"}))
    # A chained error (KeyError -> ours) logs its cause first: look at every logged exception.
    raised = [report.get("error", ""), *report.get("logged_exceptions", [])]
    assert any(LOUD_LOAD_HINT in error for error in raised), report


def test_a_quantized_mtp_block_loads_as_stock_vllm_builds_it(engine_run, engineered_checkpoint):
    stock = engine_run(EngineRun("unpatched", QUANTIZED_MTP, {}))
    report = engine_run(EngineRun("patched", QUANTIZED_MTP, {}))
    assert_full_acceptance_and_lossless(stock, engineered_checkpoint, QUANTIZED_MTP)
    assert_full_acceptance_and_lossless(report, engineered_checkpoint, QUANTIZED_MTP)
    assert draft_methods(report) == draft_methods(stock)
    assert "CompressedTensorsLinearMethod" in draft_methods(report)


def bad_layout_named(case: Case) -> list[str]:
    """What the series' error on a bad MTP layout names: the damaged tensor (under the checkpoint's name or
    the draft's, both ending alike), or the declared MTP layer the checkpoint lacks."""
    if case.options["damage"] == "mtp-layers-overdeclared":
        missing_layer = (0 if case.arch in MTP_LAYERS_NUMBERED_FROM_ZERO else NUM_HIDDEN_LAYERS) + 1
        if drafter_check := DRAFTER_MISSING_LAYER_ERROR.get(case.arch):
            return [drafter_check.format(layer=missing_layer)]
        return [f"model.layers.{missing_layer}."]  # the series' load check names the layer's tensors
    return [damaged_mtp_tensor(case.arch)]


@pytest.mark.parametrize("case", BAD_LAYOUTS, ids=Case.name)
def test_a_bad_mtp_layout_is_an_error_naming_it(engine_run, engineered_checkpoint, stock_result, case):
    assert_stock_result(engine_run(EngineRun("unpatched", case, {})), stock_result(case))
    report = engine_run(EngineRun("patched", case, {}))
    if case.options["damage"] == "mtp-layers-overdeclared" and case.arch in DRAFTER_BUILDS_FIRST_LAYER_ONLY:
        # The layer missing from disk is never built: nothing is lost.
        assert_full_acceptance_and_lossless(report, engineered_checkpoint, case)
        return
    assert all(words in report.get("error", "") for words in bad_layout_named(case)), report


@pytest.mark.parametrize("case", OWN_SCHEME_MTP, ids=Case.name)
def test_an_mtp_layer_in_a_scheme_of_its_own_drafts_as_its_dequantized_weights_do(
    engine_run, engineered_checkpoint, case
):
    """The MTP layer is built in its own group's scheme (a quantized draft, not the trunk's: stock's
    load fails, test_unpatched_vllm_shows_the_stock_result) and accepts exactly the drafts of the same
    checkpoint holding its dequantized weights in BF16, losslessly."""
    report = engine_run(EngineRun("patched", case, {}))
    assert_drafts_as_its_dequantized_reference(report, engine_run, engineered_checkpoint, case)
    assert draft_methods(report) - UNQUANTIZED, draft_methods(report)


def assert_drafts_as_its_dequantized_reference(report: dict, engine_run, engineered_checkpoint, case) -> None:
    """The run drafted as the checkpoint holding the MTP layer's dequantized weights in BF16 (the patched
    engine's run of own_scheme_reference), up to the kernels' rounding (drafts_as_reference), losslessly."""
    reference = engine_run(EngineRun("patched", own_scheme_reference(case), {}))
    assert "error" not in report, report["error"]
    assert "error" not in reference, reference["error"]
    assert drafts_as_reference(report, reference), (report, reference)
    assert (
        report["outputs"]
        == reference["outputs"]
        == expected_outputs(engineered_checkpoint(case.quant, case.arch, **case.options))
    )
    assert draft_methods(reference) <= UNQUANTIZED
