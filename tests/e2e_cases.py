"""The end-to-end cases: engineered quantized checkpoints with a BF16 MTP block (checkpoints.py), what
stock vLLM makes of each on each test-bed target, and the engine runs that check them.

Shared by tests/test_e2e_mtp_acceptance.py and benchmarks/mtp_acceptance.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MTP = {"method": "mtp", "num_speculative_tokens": 2}
ARCHITECTURES = ("mimo", "glm4_moe", "step3p5")


@dataclass(frozen=True)
class Case:
    """A quantized checkpoint whose MTP block is BF16, and what stock vLLM makes of it.

    stock: "acceptance X" (0.0: silently broken drafts) or words of the exception stock vLLM
    raises; a dict when stock releases differ (test-bed target -> result).
    """

    arch: str
    quant: str
    stock: str | dict[str, str]
    options: dict = field(default_factory=dict)

    def name(self) -> str:
        flags = [key if value is True else str(value) for key, value in self.options.items()]
        return "-".join([self.arch, self.quant, *flags])

    def stock_result(self, target: str) -> str:
        return self.stock[target] if isinstance(self.stock, dict) else self.stock


# GLM builds its draft under the checkpoint's own names (model.layers.N.*), so an `ignore` list that
# names the MTP layer already works there; it breaks when the quantizer never listed that layer.
# Stock Step-3.5 loads no compressed-tensors MTP draft at all: its strict loader wants the KV-cache
# scales such a config adds; with the BF16 block built quantized it fails there too.
CASES = [
    Case("mimo", "int8_w8a8", "acceptance 0.0"),
    Case("mimo", "int8_w8a8", "acceptance 0.0", {"ignore_style": "regex"}),
    Case("mimo", "int8_w8a8", "acceptance 0.0", {"ignore_style": "unlisted"}),
    Case(
        "mimo",
        "w4a16",
        {
            "0.22.1": "KeyError: 'model.mtp_layers.2.mtp_block.mlp.down_proj.weight'",
            "0.32.0": "no module or parameter named 'model.mtp_layers.2.mtp_block.mlp.down_proj.weight'",
        },
    ),
    Case("glm4_moe", "int8_w8a8", "acceptance 1.0"),
    Case(
        "glm4_moe",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        {"ignore_style": "unlisted"},
    ),
    Case(
        "glm4_moe",
        "w4a16",
        {
            "0.22.1": "KeyError: 'model.layers.2.mtp_block.mlp.experts.w2_weight'",
            "0.32.0": "No WNA16 MoE backend supports the deployment configuration",
        },
        {"ignore_style": "unlisted"},
    ),
    Case(
        "step3p5",
        "int8_w8a8",
        "are not in the checkpoint and will falsely use random initialization",
        {"ignore_style": "unlisted"},
    ),
]
# Where draft_quant_config's explicit choices are checked.
CHOICE_CASES = [CASES[0]]
# A checkpoint whose MTP block was quantized on purpose: the series must leave it as stock vLLM
# builds it (the target's quantization), and loud loading must not fire on it.
QUANTIZED_MTP = Case(
    "mimo", "int8_w8a8", "acceptance 1.0", {"ignore_style": "unlisted", "quantize_mtp": True}
)
# Tensor parallelism (on the newest test-bed target): each rank builds and loads its shards.
TENSOR_PARALLEL_SIZE = 2
TENSOR_PARALLEL_CASES = [CASES[0], CASES[5]]


@dataclass(frozen=True)
class EngineRun:
    """One engine run of the plan: a checkpoint, the vLLM variant, and the speculative config."""

    variant: str  # "patched" or "unpatched"
    case: Case
    speculative: dict | None = None  # merged into MTP; None runs without MTP
    tensor_parallel_size: int = 1

    @property
    def key(self) -> str:
        choice = "no-mtp" if self.speculative is None else self.speculative.get("draft_quant_config", "auto")
        return f"{self.variant}:{self.case.name()}:{choice}:tp{self.tensor_parallel_size}"

    def speculative_config(self) -> dict | None:
        return None if self.speculative is None else {**MTP, **self.speculative}

    @property
    def kind(self) -> tuple:
        """Runs of one kind share a probe process (an in-process engine has one rank)."""
        return (self.variant, self.tensor_parallel_size)


def baseline(arch: str) -> Case:
    return Case(arch, "bf16", "acceptance 1.0")


def engine_plan(newest_target: bool) -> list[EngineRun]:
    """Every engine run the end-to-end suite checks, for one test-bed target."""
    runs = [EngineRun("patched", baseline(arch), {}) for arch in ARCHITECTURES]
    for case in [*CASES, QUANTIZED_MTP]:
        runs += [EngineRun("unpatched", case, {}), EngineRun("patched", case, {})]
    for case in CHOICE_CASES:
        runs += [EngineRun("patched", case, {"draft_quant_config": choice}) for choice in ("none", "inherit")]
    # A format the CPU cannot run at all shows in a run without MTP (see the W4A16 tests).
    runs += [EngineRun("patched", case) for case in CASES if case.quant == "w4a16"]
    if newest_target:
        runs += [EngineRun("patched", case, {}, TENSOR_PARALLEL_SIZE) for case in TENSOR_PARALLEL_CASES]
        runs.append(EngineRun("unpatched", TENSOR_PARALLEL_CASES[0], {}, TENSOR_PARALLEL_SIZE))
    return runs


def engine_specs(runs: list[EngineRun], checkpoint_of) -> dict[str, dict]:
    """The probe's RUNS_JSON for runs of one kind (tests/probes/engine_acceptance.py), keyed by run.
    checkpoint_of(case) gives the case's checkpoint directory."""
    return {
        run.key: {
            "model": str(checkpoint_of(run.case)),
            "speculative_config": run.speculative_config(),
            "tensor_parallel_size": run.tensor_parallel_size,
            "in_process": run.tensor_parallel_size == 1,
        }
        for run in runs
    }
