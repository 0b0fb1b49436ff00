"""MTP on quantized checkpoints under tensor parallelism (tensor_parallel_size=2), on the real vLLM CPU
engine, its two ranks bound to one CPU each: every rank builds the same unquantized draft from the
same decision, loads its shards of the BF16 MTP tensors (strict loading checks each rank's sharded
parameters), and MTP stays lossless. Collected on the newest test-bed target only (conftest.py).
"""

from __future__ import annotations

import pytest

from tests.e2e_cases import (
    TENSOR_PARALLEL_CASES,
    TENSOR_PARALLEL_SIZE,
    TENSOR_PARALLEL_STOCK_CASES,
    Case,
    EngineRun,
)
from tests.test_e2e_mtp_acceptance import UNQUANTIZED, assert_full_acceptance_and_lossless


@pytest.mark.parametrize("case", TENSOR_PARALLEL_CASES, ids=Case.name)
def test_every_rank_builds_and_loads_the_bf16_draft_shards(engine_run, engineered_checkpoint, case):
    report = engine_run(EngineRun("patched", case, {}, TENSOR_PARALLEL_SIZE))
    assert_full_acceptance_and_lossless(report, engineered_checkpoint, case)
    ranks = report["draft_ranks"]
    assert sorted(rank["rank"] for rank in ranks) == list(range(TENSOR_PARALLEL_SIZE))
    assert len({str(rank["draft_quant_decision"]) for rank in ranks}) == 1
    for rank in ranks:
        assert set(rank["linears"].values()) <= UNQUANTIZED, rank["linears"]
    # The ranks hold halves: a column-parallel projection is half as wide as on one rank.
    single = engine_run(EngineRun("patched", case, {}))["draft_ranks"][0]["parameter_shapes"]
    sharded = ranks[0]["parameter_shapes"]
    # qkv_proj, or multi-head latent attention's kv_b_proj: column-parallel either way.
    column = next(name for name in single if name.endswith(("qkv_proj.weight", "kv_b_proj.weight")))
    assert sharded[column][0] * TENSOR_PARALLEL_SIZE == single[column][0]


@pytest.mark.parametrize("case", TENSOR_PARALLEL_STOCK_CASES, ids=Case.name)
def test_unpatched_vllm_drafts_garbage_under_tensor_parallelism_too(engine_run, case):
    report = engine_run(EngineRun("unpatched", case, {}, TENSOR_PARALLEL_SIZE))
    assert "error" not in report, report["error"]
    assert report["draft_tokens"] > 0 and report["acceptance"] == 0.0
