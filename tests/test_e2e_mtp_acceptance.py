"""MTP on quantized checkpoints with a BF16 MTP block, on the real vLLM CPU engine.

Engineered tiny checkpoints (checkpoints.py) make every draft right exactly when the MTP block's own
weights load correctly, so acceptance tells a working draft (1.0) from a broken one (0.0). Each
engine run is one probe process (the CPU platform spawns its workers); runs are cached per session.
"""

from __future__ import annotations

import json

import pytest
from e2e_cases import CASES, CHOICE_CASES, MTP, QUANTIZED_MTP, Case

PROBE = "engine_acceptance"
# The two ways patched vLLM refuses a draft whose parameters the checkpoint's MTP tensors do not fit.
LOUD_LOAD_ERRORS = ("MTP draft parameter(s) received no checkpoint tensor", "MTP draft has no parameter for")


@pytest.fixture(scope="session")
def engine(vllm_probe, engineered_checkpoint):
    """`engine(variant, arch, quant, options, speculative)`: one engine run's report.

    speculative=None runs without MTP; otherwise it is merged into {"method": "mtp", ...}.
    """

    def run(variant: str, arch: str, quant: str, options: dict, speculative: dict | None) -> dict:
        args = [str(engineered_checkpoint(quant, arch, **options))]
        if speculative is not None:
            args += ["--speculative-config", json.dumps({**MTP, **speculative})]
        return vllm_probe(PROBE, variant, *args)

    return run


def run_case(engine, variant: str, case: Case, speculative: dict | None = None) -> dict:
    return engine(variant, case.arch, case.quant, case.options, speculative)


def run_without_mtp(engine, case: Case) -> dict:
    """The no-MTP greedy output; the ignore list changes nothing in the main model, so it is shared."""
    return engine("patched", case.arch, case.quant, {}, None)


def assert_lossless_full_acceptance(report: dict, without_mtp: dict) -> None:
    assert "error" not in report, report["error"]
    assert report["acceptance"] == 1.0, report
    assert report["outputs"] == without_mtp["outputs"]


@pytest.mark.parametrize("arch", ["mimo", "glm4_moe", "step3p5"])
def test_bf16_checkpoint_accepts_every_draft(engine, arch):
    """The baseline the quantized cases must reach."""
    report = engine("patched", arch, "bf16", {}, {})
    assert "error" not in report, report["error"]
    assert report["acceptance"] == 1.0 and report["draft_tokens"] > 0


@pytest.mark.parametrize("case", CASES, ids=Case.name)
def test_unpatched_vllm_shows_the_stock_result(engine, case):
    report = run_case(engine, "unpatched", case, {})
    if case.stock_result.startswith("acceptance "):
        assert "error" not in report, report["error"]
        assert report["draft_tokens"] > 0
        assert report["acceptance"] == float(case.stock_result.removeprefix("acceptance "))
    else:
        assert case.stock_result in report["error"]


@pytest.mark.parametrize("case", CASES, ids=Case.name)
def test_auto_reaches_the_bf16_acceptance_losslessly(engine, case):
    without_mtp = run_without_mtp(engine, case)
    assert_lossless_full_acceptance(run_case(engine, "patched", case, {}), without_mtp)


@pytest.mark.parametrize("case", CHOICE_CASES, ids=Case.name)
def test_none_builds_the_draft_unquantized(engine, case):
    without_mtp = run_without_mtp(engine, case)
    report = run_case(engine, "patched", case, {"draft_quant_config": "none"})
    assert_lossless_full_acceptance(report, without_mtp)


@pytest.mark.parametrize("case", CHOICE_CASES, ids=Case.name)
def test_inherit_fails_loudly_instead_of_drafting_garbage(engine, case):
    report = run_case(engine, "patched", case, {"draft_quant_config": "inherit"})
    # A chained error (KeyError -> ours) logs its cause first: look at every logged exception.
    raised = [report.get("error", ""), *report.get("logged_exceptions", [])]
    loud = [error for error in raised if any(message in error for message in LOUD_LOAD_ERRORS)]
    assert loud, report
    assert "draft_quant_config" in loud[0]


def test_a_quantized_mtp_block_loads_as_stock_vllm_builds_it(engine):
    stock = run_case(engine, "unpatched", QUANTIZED_MTP, {})
    report = run_case(engine, "patched", QUANTIZED_MTP, {})
    assert "error" not in stock, stock["error"]
    assert_lossless_full_acceptance(report, run_without_mtp(engine, QUANTIZED_MTP))
    assert (report["acceptance"], report["outputs"]) == (stock["acceptance"], stock["outputs"])
