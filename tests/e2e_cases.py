"""The end-to-end cases: engineered quantized checkpoints with a BF16 MTP block (checkpoints.py).

Shared by tests/test_e2e_mtp_acceptance.py and benchmarks/mtp_acceptance.py.
"""

MTP = {"method": "mtp", "num_speculative_tokens": 2}


class Case:
    """A quantized checkpoint whose MTP block is BF16, and what stock vLLM 0.22.1 makes of it."""

    def __init__(self, arch: str, quant: str, stock_result: str, **options):
        self.arch, self.quant, self.stock_result, self.options = arch, quant, stock_result, options

    def name(self) -> str:
        flags = [key if value is True else str(value) for key, value in self.options.items()]
        return "-".join([self.arch, self.quant, *flags])


# stock_result: "acceptance X" (0.0: silently broken drafts) or the exception stock vLLM raises.
# GLM builds its draft under the checkpoint's own names (model.layers.N.*), so an `ignore` list that
# names the MTP layer already works there; it breaks when the quantizer never listed that layer.
CASES = [
    Case("mimo", "int8_w8a8", "acceptance 0.0"),
    Case("mimo", "int8_w8a8", "acceptance 0.0", ignore_style="regex"),
    Case("mimo", "w4a16", "KeyError: 'model.mtp_layers.2.mtp_block.mlp.down_proj.weight'"),
    Case("glm4_moe", "int8_w8a8", "acceptance 1.0"),
    Case(
        "glm4_moe",
        "int8_w8a8",
        "No Int8 MoE backend supports the deployment configuration",
        ignore_style="unlisted",
    ),
    Case(
        "glm4_moe",
        "w4a16",
        "KeyError: 'model.layers.2.mtp_block.mlp.experts.w2_weight'",
        ignore_style="unlisted",
    ),
    # Stock Step-3.5 loads no compressed-tensors MTP draft at all: its strict loader wants the KV-cache
    # scales such a config adds (patch 0010); with the BF16 block built quantized it fails there too.
    Case(
        "step3p5",
        "int8_w8a8",
        "are not in the checkpoint and will falsely use random initialization",
        ignore_style="unlisted",
    ),
]
# Where draft_quant_config's explicit choices are checked (one engine start each).
CHOICE_CASES = [case for case in CASES if case.arch == "mimo" and not case.options]
# A checkpoint whose MTP block was quantized on purpose: the series must leave it as stock vLLM
# builds it (the target's quantization), and loud loading must not fire on it.
QUANTIZED_MTP = Case("mimo", "int8_w8a8", "as stock", ignore_style="unlisted", quantize_mtp=True)
