"""The doctor's predictions against what the real vLLM CPU engine does, on every checkpoint of the
end-to-end suite, for stock vLLM and for vLLM with the series, at this session's target.

The engine reports are the suite's own (engine_run): no engine starts here. The doctor runs as a user
runs it, `python -S -m mtpq doctor CKPT --vllm TARGET --platform cpu --json` (cpu-amx on a CPU with AMX).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.commands import run_mtpq
from tests.cpu_features import doctor_platform
from tests.e2e_cases import (
    CASES,
    E2E_FAMILIES,
    EXAONE_MOE_NAMED_IN_IGNORE,
    GRAFTED,
    OWN_SCHEME_MTP,
    QUANTIZED_MTP,
    QUANTIZER_EXPORTS,
    QWEN3_5_ALL,
    QWEN3_5_BAD_INPUT,
    QWEN3_5_FAMILIES,
    SILENT_FAILURE_ACCEPTANCE,
    Case,
    EngineRun,
    baseline,
    drafts_as_reference,
    own_scheme_reference,
)
from tests.test_e2e_mtp_acceptance import cpu_cannot_run

# Stock vLLM's failure on a Qwen3.5 config declaring two MTP layers is the tiny model's KV-cache grouping
# (e2e_cases.QWEN3_5_BAD_INPUT), which the doctor does not model.
# Nor that stock MiMo-V2's (and -Omni's) loader skips the BF16 `weight` a pack-quantized draft has no
# parameter for (mimo_v2_mtp.py: `if name not in params_dict: continue`): it predicts the load error, the
# engine drafts 0 %.
NOT_PREDICTED = [
    *[(case, "stock") for case in QWEN3_5_BAD_INPUT if case.options["damage"] == "mtp-layers-overdeclared"],
    *[
        (case, "stock")
        for case in CASES
        if case.arch in ("mimo_v2_flash", "mimo_v2") and case.quant == "w4a16"
    ],
    # Nor why stock 0.22.1 builds EXAONE MoE's MTP layer quantized where `ignore` names it.
    *[(case, "stock") for case in CASES if case.stock is EXAONE_MOE_NAMED_IN_IGNORE],
]
# Stock runs are planned for every case but the BF16 baselines (stock vLLM serves those, untested here).
CHECKED = [
    *[(baseline(arch), "patched") for arch in (*E2E_FAMILIES, *QWEN3_5_FAMILIES)],
    *[
        (case, flavour)
        for case in [
            *CASES,
            QUANTIZED_MTP,
            *OWN_SCHEME_MTP,
            *QUANTIZER_EXPORTS,
            *QWEN3_5_ALL,
            *QWEN3_5_BAD_INPUT,
        ]
        for flavour in ("stock", "patched")
        if (case, flavour) not in NOT_PREDICTED
    ],
]
VARIANT = {"stock": "unpatched", "patched": "patched"}


@pytest.fixture(scope="session")
def doctor(engineered_checkpoint, pin):
    """`doctor(case)`: the doctor's JSON report on the case's checkpoint, at the target, on CPU."""
    reports = {}

    def report(case: Case) -> dict:
        if case.name() not in reports:
            checkpoint = engineered_checkpoint(case.quant, case.arch, **case.options)
            done = run_mtpq(
                "doctor", checkpoint, "--vllm", pin.version, "--platform", doctor_platform(), "--json"
            )
            assert done.returncode in (0, 1), done.stderr
            reports[case.name()] = json.loads(done.stdout)
        return reports[case.name()]

    return report


def engine_verdict(report: dict, works: Callable[[dict], bool]) -> str:
    if "error" in report:
        return "crash"
    if works(report):
        return "works"
    if report["acceptance"] <= SILENT_FAILURE_ACCEPTANCE:
        return "silent 0 % acceptance"
    return f"acceptance {report['acceptance']}"


def working_draft(engine_run, case: Case) -> Callable[[dict], bool]:
    """Whether a run's drafts are a working draft's: all accepted, but for an MTP layer in a scheme of its
    own those its dequantized weights draft (own_scheme_reference, up to rounding)."""
    if "mtp_quant" not in case.options:
        return lambda report: report["acceptance"] == 1.0
    reference = engine_run(EngineRun("patched", own_scheme_reference(case), {}))
    return lambda report: drafts_as_reference(report, reference)


@pytest.mark.parametrize(
    ("case", "flavour"), CHECKED, ids=[f"{case.name()}-{flavour}" for case, flavour in CHECKED]
)
def test_the_doctor_predicts_what_the_engine_does(doctor, engine_run, pin, case, flavour):
    report = engine_run(EngineRun(VARIANT[flavour], case, {}))  # first: it skips what cannot run here
    predicted = doctor(case)["releases"][pin.version][flavour]
    verdict = engine_verdict(report, working_draft(engine_run, case))
    print(f"\n{case.name()} {flavour}: doctor {predicted['kind']}, engine {verdict}")
    if (
        flavour == "patched"
        and case.quant == "w4a16"
        and "mtp_quant" not in case.options  # those run only where the CPU runs W4A16 (Case.cannot_run)
        and (platform_error := cpu_cannot_run(engine_run, case, report))
    ):
        # Not the draft's doing: this CPU cannot run the target's format at all, MTP or not.
        assert predicted["kind"] == "works" and report["error"] == platform_error
        return
    raised = " ".join([report.get("error", ""), *report.get("logged_exceptions", [])])
    if predicted["kind"] == "MTP silently off":
        # Served as it is, nothing drafts; asked for "mtp", vLLM fails as the doctor says.
        assert predicted["error"] and predicted["error"] in raised, (predicted, raised)
        return
    assert verdict == predicted["kind"], (predicted, report.get("error"))
    if predicted["error"]:
        assert predicted["error"] in raised


@pytest.mark.parametrize("case", QUANTIZER_EXPORTS, ids=Case.name)
def test_a_quantizer_export_is_diagnosed_with_what_it_lacks(doctor, pin, case):
    report = doctor(case)
    verdicts = report["releases"][pin.version]
    assert (
        report["mtp_tensors"]["modules"] == {} and "num_nextn_predict_layers" in report["declared"]["source"]
    )
    assert any(fix.startswith("graft --mtp-from") for fix in verdicts["fix"])
    if case.arch == "glm4_moe":  # its config class counts 1 MTP layer: the series names the missing tensors
        assert verdicts["patched"]["kind"] == "crash" and "no tensor in" in verdicts["patched"]["error"]
    else:
        assert report["declared"]["count"] == 0
        assert verdicts["stock"]["kind"] == verdicts["patched"]["kind"] == "MTP silently off"


@pytest.mark.parametrize("case", GRAFTED, ids=Case.name)
def test_graft_reports_whether_stock_vllm_then_serves_the_mtp(
    engineered_checkpoint, doctor, pin, stock_result, case
):
    checkpoint = engineered_checkpoint(case.quant, case.arch, **case.options)
    graft = engineered_checkpoint.grafts[checkpoint]
    verdicts = doctor(case)["releases"][pin.version]
    assert verdicts["patched"]["kind"] == "works"
    if case.options["graft"] == "plain":
        assert graft.returncode == 0 and verdicts["stock"]["kind"] != "works"
    elif stock_result(case) == "acceptance 1.0":
        assert graft.returncode == 0 and f"stock vLLM {pin.version}: " in graft.stdout
        assert verdicts["stock"]["kind"] == "works"
    else:
        assert graft.returncode == 1
        assert f"stock vLLM {pin.version} cannot serve its MTP: " in graft.stdout
        assert "MTP loader refuses every compressed-tensors checkpoint" in graft.stdout
