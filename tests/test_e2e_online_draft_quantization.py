"""A BF16 MTP layer quantized online by draft_quant_config (vLLM's online quantization schemes), on the real
vLLM CPU engine and the engineered checkpoints (test_e2e_mtp_acceptance.py): a scheme the CPU runs drafts
as well as the BF16 draft, losslessly; the others are refused at start-up naming the option and the reason;
stock vLLM has no such option. The runs share the probe processes of the other end-to-end tests.
"""

from __future__ import annotations

import pytest

from tests.e2e_cases import (
    ONLINE_DRAFT_CASES,
    STOCK_ONLINE_DRAFT,
    EngineRun,
    OnlineDraftCase,
    online_draft_runs,
)
from tests.test_e2e_mtp_acceptance import (
    assert_full_acceptance_and_lossless,
    assert_stock_result,
    cpu_cannot_run,
)

# A draft quantized online may lose this much acceptance against the BF16 draft (on these engineered
# checkpoints the BF16 draft accepts every token).
ACCEPTANCE_TOLERANCE = 0.01
# Quant methods of vLLM's online linear schemes end so (Fp8PtpcOnlineLinearMethod, ...).
ONLINE_METHOD_SUFFIX = "OnlineLinearMethod"


def patched_result(online: OnlineDraftCase, target: str) -> str:
    if target not in online.patched:
        pytest.skip(f"vLLM {target}'s series refuses online draft quantization (test_speculative_config.py)")
    return online.patched[target]


@pytest.mark.parametrize("online", ONLINE_DRAFT_CASES, ids=OnlineDraftCase.name)
def test_online_draft_quantization(engine_run, engineered_checkpoint, pin, online):
    expected = patched_result(online, pin.version)
    patched, _ = online_draft_runs(online)
    report = engine_run(patched)
    if not expected.startswith("acceptance "):
        raised = [report.get("error", ""), *report.get("logged_exceptions", [])]
        assert any(expected in error for error in raised), report
        given = [f"{name}={value!r}" for name, value in online.option.items()]
        names_option = (all(field in error for field in given) for error in raised)
        assert any(names_option) or not online.series_refuses, report
        return
    if online.case.quant == "w4a16" and (platform_error := cpu_cannot_run(engine_run, online.case, report)):
        pytest.skip(f"this CPU cannot run the W4A16 target even without MTP: {platform_error}")
    assert_full_acceptance_and_lossless(report, engineered_checkpoint, online.case)
    bf16_draft = engine_run(EngineRun("patched", online.case, {}))
    assert abs(report["acceptance"] - bf16_draft["acceptance"]) <= ACCEPTANCE_TOLERANCE
    methods = {method for rank in report["draft_ranks"] for method in rank["linears"].values()}
    assert any(method.endswith(ONLINE_METHOD_SUFFIX) for method in methods), methods


@pytest.mark.parametrize("online", ONLINE_DRAFT_CASES, ids=OnlineDraftCase.name)
def test_stock_vllm_has_no_online_draft_option(engine_run, pin, online):
    patched_result(online, pin.version)
    _, stock = online_draft_runs(online)
    report = engine_run(stock)
    assert_stock_result(report, STOCK_ONLINE_DRAFT)
    assert "draft_quant_config" in report["error"]
