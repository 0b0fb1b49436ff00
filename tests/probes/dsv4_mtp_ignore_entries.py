"""Probe section: whether a DeepSeek-V4 checkpoint's quant ignore entries for its MTP layer reach the
MTP draft's modules.

DeepSeek-V4 checkpoints name MTP layer i ``mtp.{i}.*``; the target's weights mapper rewrites the shared
quant config's entries to ``model.mtp.{i}.*``, while the draft builds that layer as
``model.layers.{num_hidden_layers + i}.*``. For each way a checkpoint leaves its BF16 MTP layer out of
its compressed-tensors FP8 block quantization (IGNORE_SCENARIOS) it writes config.json only (no
safetensors: draft_quant_config "auto" has no headers to read and keeps the target's config, so the
ignore entries alone decide), builds the draft as CUDA does (mtp_vllm.deepseek_v4_stand_ins) and
reports what e_proj / h_proj / the head were built as, and the target's ignore list before and after.

Result: ``{scenario: {"e_proj": {...}, "h_proj": {...}, "head": {...}, "target_ignore_before": [...],
"target_ignore_after": [...], "target_quant_config_is_shared": bool}}`` or ``{"error_type", "error"}``.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import torch

from tests.probes.mtp_draft_construction import CONSTRUCTION_ONLY
from tests.probes.mtp_vllm import build_mtp_draft, deepseek_v4_stand_ins, failure

# Ways a checkpoint leaves its BF16 MTP layer (``mtp.0.*``) out of quantization.
IGNORE_SCENARIOS = {
    "exact_names": ["lm_head", "mtp.0.e_proj", "mtp.0.h_proj", "mtp.0.head"],
    "whole_layer_regex": ["lm_head", "re:.*mtp.*"],
}

TINY_DSV4 = CONSTRUCTION_ONLY["deepseek_v4"]
NUM_HIDDEN_LAYERS = TINY_DSV4.hf_config["num_hidden_layers"]


def describe(module: torch.nn.Module) -> dict:
    return {
        "prefix": getattr(module, "prefix", None),
        "quant_method": type(module.quant_method).__name__,
        "weight_dtype": str(module.weight.dtype),
    }


def build_draft_and_describe(checkpoint_dir: Path, ignore: list[str]) -> dict:
    quantization_config = {**TINY_DSV4.quantization_config, "ignore": ignore}
    hf_config = {**TINY_DSV4.hf_config, "quantization_config": quantization_config}
    (checkpoint_dir / "config.json").write_text(json.dumps(hf_config))
    target = {}

    def remember_target_ignore(vllm_config) -> None:
        target["quant_config"] = vllm_config.quant_config
        target["ignore_before"] = copy.deepcopy(vllm_config.quant_config.ignore)

    draft, _ = build_mtp_draft(
        checkpoint_dir,
        deepseek_v4_stand_ins(),
        cache_dtype=TINY_DSV4.cache_dtype,
        after_target_loading=remember_target_ignore,
    )
    mtp_layer = draft.model.layers[str(NUM_HIDDEN_LAYERS)]
    return {
        "e_proj": describe(mtp_layer.e_proj),
        "h_proj": describe(mtp_layer.h_proj),
        "head": describe(mtp_layer.shared_head.head),
        "target_ignore_before": target["ignore_before"],
        "target_ignore_after": target["quant_config"].ignore,
        "target_quant_config_is_shared": draft.quant_config is target["quant_config"],
    }


def run_scenario(ignore: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="mtpq-dsv4-ignore-") as checkpoint_dir:
        try:
            return build_draft_and_describe(Path(checkpoint_dir), ignore)
        # Any construction failure is a finding to report, not a probe crash.
        except Exception as exc:  # noqa: BLE001
            return failure(exc)


def probe() -> dict:
    return {name: run_scenario(ignore) for name, ignore in IGNORE_SCENARIOS.items()}
