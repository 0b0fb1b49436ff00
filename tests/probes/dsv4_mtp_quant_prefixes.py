"""Probe: how the DeepSeek-V4 MTP draft applies a checkpoint's quant ignore list.

Run under an unpatched or a patched vLLM (patched ``vllm`` first on PYTHONPATH).
Builds real vLLM configs for a tiny DeepSeek-V4 checkpoint whose compressed-
tensors INT8 W8A8 config ignores the BF16 MTP block by checkpoint names, lets
the target's weights mapper rewrite the shared quant config as target loading
does, then builds the MTP draft model on CPU. Only the CUDA-bound pieces are
stood in for: the draft's DeepseekV4DecoderLayer and torch.cuda.Stream.

Last stdout line: one JSON object with, per ignore-list scenario, what e_proj /
h_proj / head were built as and whether the target's quant config kept its
ignore list, or ``{"error_type": ..., "error": ...}`` when construction raises.
"""

import copy
import json
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch
from mtp_draft_construction import ARCHITECTURES
from mtp_vllm import (
    INT8_W8A8_QUANTIZATION_CONFIG,
    failure,
    init_single_process_distributed,
    mtp_vllm_config,
)

# Ways a checkpoint leaves its BF16 MTP block (``mtp.0.*``) out of quantization.
IGNORE_SCENARIOS = {
    "exact_names": ["lm_head", "mtp.0.e_proj", "mtp.0.h_proj", "mtp.0.head"],
    "whole_block_regex": ["lm_head", "re:.*mtp.*"],
}

TINY_DSV4_CONFIG = ARCHITECTURES["deepseek_v4"].hf_config
NUM_HIDDEN_LAYERS = TINY_DSV4_CONFIG["num_hidden_layers"]


def build_vllm_config(checkpoint_dir: Path, ignore: list[str]):
    quantization_config = {**INT8_W8A8_QUANTIZATION_CONFIG, "ignore": ignore}
    hf_config = {**TINY_DSV4_CONFIG, "quantization_config": quantization_config}
    (checkpoint_dir / "config.json").write_text(json.dumps(hf_config))
    return mtp_vllm_config(checkpoint_dir)


def describe(module: torch.nn.Module) -> dict:
    return {
        "prefix": getattr(module, "prefix", None),
        "quant_method": type(module.quant_method).__name__,
        "scheme": type(getattr(module, "scheme", None)).__name__,
        "weight_dtype": str(module.weight.dtype),
    }


def build_draft_and_describe(checkpoint_dir: Path, ignore: list[str]) -> dict:
    from vllm.model_executor.model_loader.utils import (
        configure_quant_config,
        initialize_model,
    )
    from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    vllm_config = build_vllm_config(checkpoint_dir, ignore)
    draft_model_config = vllm_config.speculative_config.draft_model_config

    # Target loading runs the target's weights mapper over the quant config
    # that the draft then shares (model runner v1 passes the same object).
    target_quant_config = vllm_config.quant_config
    configure_quant_config(target_quant_config, DeepseekV4ForCausalLM)
    target_ignore_before = copy.deepcopy(target_quant_config.ignore)

    # CUDA-only stand-ins; the MTP layer's own modules are built for real.
    with (
        mock.patch("vllm.models.deepseek_v4.nvidia.mtp.DeepseekV4DecoderLayer"),
        mock.patch("torch.cuda.Stream"),
        set_default_torch_dtype(draft_model_config.dtype),
    ):
        draft = initialize_model(vllm_config=vllm_config, model_config=draft_model_config)

    mtp_layer = draft.model.layers[str(NUM_HIDDEN_LAYERS)]
    return {
        "e_proj": describe(mtp_layer.e_proj),
        "h_proj": describe(mtp_layer.h_proj),
        "head": describe(mtp_layer.shared_head.head),
        "target_ignore": target_ignore_before,
        "target_ignore_unchanged": target_quant_config.ignore == target_ignore_before,
        "target_quant_config_is_shared": draft.quant_config is target_quant_config,
    }


def run_scenario(ignore: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as checkpoint_dir:
        try:
            return build_draft_and_describe(Path(checkpoint_dir), ignore)
        # Any construction failure is a finding to report, not a probe crash.
        except Exception as exc:  # noqa: BLE001
            return failure(exc)


def main() -> None:
    import vllm

    init_single_process_distributed()
    result = {name: run_scenario(ignore) for name, ignore in IGNORE_SCENARIOS.items()}
    result["vllm_file"] = vllm.__file__
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
