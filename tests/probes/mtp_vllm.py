"""What the draft probes share: quantization configs vLLM's CPU backend can build (some only with their
CUDA kernel choice stood in), the vLLM configs the engine derives from a checkpoint directory for an MTP
draft, building that draft on CPU the way the proposer does, loading it through the engine's default
loader, and describing what it was built as.

Written for every test-bed target (vLLM 0.22.1 with the v0.22.1 series, 0.32.0 with the v0.33.0 one,
patched or not): where the releases or the series differ, the helpers say how.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from unittest import mock

import torch

# compressed-tensors INT8 W8A8: per-channel weights, dynamic per-token activations.
INT8_W8A8_QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
}

# compressed-tensors FP8 block-scaled linears (128x128 weight blocks, dynamic 1x128 activation groups),
# the layout of DeepSeek-V4's compressed-tensors releases.
CT_FP8_BLOCK_GROUP = {
    "format": "float-quantized",
    "targets": ["Linear"],
    "weights": {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": "block",
        "block_structure": [128, 128],
    },
    "input_activations": {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "strategy": "group",
        "group_size": 128,
        "dynamic": True,
    },
}

# Kernel choices vLLM makes while it builds a quantized layer, for which its CPU backend has no
# kernel (FP8 needs AMX, NVFP4 / MXFP4 / INT4 MoE have none): standing in for the choice alone still
# builds the layer's real parameters, and loading weights never reaches a kernel. A path missing
# from a release is skipped (each names the module that imports the chooser).
_QUANTIZATION = "vllm.model_executor.layers.quantization"
_CT_SCHEMES = f"{_QUANTIZATION}.compressed_tensors.schemes"
_CT_MOE = f"{_QUANTIZATION}.compressed_tensors.compressed_tensors_moe"
LINEAR_KERNEL_CHOICES = (
    f"{_QUANTIZATION}.fp8.init_fp8_linear_kernel",
    f"{_CT_SCHEMES}.compressed_tensors_w8a8_fp8.init_fp8_linear_kernel",
    # vLLM 0.22.1 builds compressed-tensors FP8 without an FP8 activation kernel as W8A16.
    f"{_CT_SCHEMES}.compressed_tensors_w8a16_fp8.init_wfp8_a16_linear_kernel",
    f"{_QUANTIZATION}.modelopt.init_nvfp4_linear_kernel",
    f"{_CT_SCHEMES}.compressed_tensors_w4a4_nvfp4.init_nvfp4_linear_kernel",
    f"{_CT_SCHEMES}.compressed_tensors_w4a4_mxfp4.init_mxfp4_linear_kernel",
)
# Weight-only INT4 kernel choices (W4A16, GPTQ; the CPU kernel takes only some layer shapes). These
# return the kernel class, whose name is read.
WEIGHT_ONLY_KERNEL_CHOICES = (
    f"{_CT_SCHEMES}.compressed_tensors_wNa16.choose_mp_linear_kernel",
    f"{_QUANTIZATION}.auto_gptq.choose_mp_linear_kernel",
)
# These return (backend, experts class).
MOE_KERNEL_CHOICES = (
    f"{_QUANTIZATION}.fp8.select_fp8_moe_backend",
    f"{_QUANTIZATION}.modelopt.select_nvfp4_moe_backend",
    f"{_QUANTIZATION}.mxfp4.select_mxfp4_moe_backend",
    f"{_CT_MOE}.compressed_tensors_moe_w8a8_fp8.select_fp8_moe_backend",
    f"{_CT_MOE}.compressed_tensors_moe_w8a8_int8.select_int8_moe_backend",
    f"{_CT_MOE}.compressed_tensors_moe_w4a4_nvfp4.select_nvfp4_moe_backend",
    f"{_CT_MOE}.compressed_tensors_moe_w4a4_mxfp4.select_mxfp4_moe_backend",
    f"{_CT_MOE}.compressed_tensors_moe_wna16.select_wna16_moe_backend",
    f"{_QUANTIZATION}.auto_gptq.select_wna16_moe_backend",
    f"{_QUANTIZATION}.moe_wna16.select_wna16_moe_backend",
)


def mla_wrapper_stand_ins(stand_in: mock.MagicMock | None = None) -> list[contextlib.AbstractContextManager]:
    """Multi-head latent attention's wrapper (the CPU platform refuses MLA; the wrapper holds no weight,
    so standing it in still builds every linear of an MLA layer) stood in by ``stand_in`` (a fresh mock
    by default) wherever a model module imported so far refers to it: DeepSeek-V2's, which the
    DeepSeek-style MTP drafters import, and any other (GLM-5-Next's, openPangu's, ...)."""
    importlib.import_module("vllm.model_executor.models.deepseek_v2")
    from vllm.model_executor.layers import mla

    stand_in = stand_in or mock.MagicMock()
    return [
        mock.patch.object(module, "MultiHeadLatentAttentionWrapper", stand_in)
        for name, module in list(sys.modules.items())
        if name.startswith("vllm.model")
        and getattr(module, "MultiHeadLatentAttentionWrapper", None) is mla.MultiHeadLatentAttentionWrapper
    ]


def _resolves(dotted: str) -> bool:
    module, _, name = dotted.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def kernel_choice_stand_ins() -> list[contextlib.AbstractContextManager]:
    """Stand-ins for every CUDA-bound kernel choice this release makes while building quantized layers."""
    linear = [mock.patch(path) for path in LINEAR_KERNEL_CHOICES if _resolves(path)]
    weight_only = [
        mock.patch(path, return_value=mock.MagicMock(__name__="StandInKernel"))
        for path in WEIGHT_ONLY_KERNEL_CHOICES
        if _resolves(path)
    ]
    moe = [
        mock.patch(path, return_value=(mock.MagicMock(), mock.MagicMock()))
        for path in MOE_KERNEL_CHOICES
        if _resolves(path)
    ]
    return linear + weight_only + moe


def cuda_stream_stand_ins() -> list[contextlib.AbstractContextManager]:
    """CUDA streams and events, which NVIDIA implementations create while built (they hold no weight)."""
    return [mock.patch("torch.cuda.Stream"), mock.patch("torch.cuda.Event")]


def deepseek_v4_stand_ins() -> list[contextlib.AbstractContextManager]:
    """Build DeepSeek-V4 as CUDA runs it: what its CUDA implementation needs from a GPU while it is
    built (streams and events, a device capability, sm_90; its tilelang mHC kernels, which vLLM 0.32+
    imports while building a decoder layer, tilelang being a GPU kernel compiler; the kernel choices of
    its quantized layers), stood in for.

    vLLM 0.22.1 resolves DeepSeek-V4 to its NVIDIA implementation on any non-ROCm platform; 0.32+ to a
    CPU one whose MTP draft is a stub raising NotImplementedError, so the NVIDIA classes are first
    registered under their architecture names.
    """
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.models.deepseek_v4.nvidia import model, mtp
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    ModelRegistry.register_model("DeepseekV4ForCausalLM", model.DeepseekV4ForCausalLM)
    ModelRegistry.register_model("DeepSeekV4MTPModel", mtp.DeepSeekV4MTP)
    return [
        *cuda_stream_stand_ins(),
        mock.patch.object(
            type(current_platform), "get_device_capability", return_value=DeviceCapability(9, 0)
        ),
        mock.patch.dict(
            "sys.modules", {"vllm.model_executor.kernels.mhc.tilelang_kernels": mock.MagicMock()}
        ),
        *kernel_choice_stand_ins(),
    ]


def inspect_in_process(*architectures: str) -> None:
    """vLLM inspects a model class in a subprocess that imports vLLM again (~15 s each on a cold
    cache) and reports a class it cannot import as "failed to be inspected"; this imports them here
    (an import error raises) and registers the classes, which vLLM then inspects in this process."""
    from vllm.model_executor.models.registry import ModelRegistry

    for architecture in architectures:
        model_class = ModelRegistry.models[architecture].load_model_cls()
        # Some platforms serve an architecture with a stand-in that is no module: vLLM handles it.
        if issubclass(model_class, torch.nn.Module):
            ModelRegistry.register_model(architecture, model_class)


def inspect_mtp_classes_in_process(checkpoint_dir: Path | str) -> None:
    """The target and MTP draft classes vLLM will build for a checkpoint, inspected in this process.
    Only a speed-up: where they cannot be named or imported here, vLLM meets the same failure itself."""
    from vllm.config import SpeculativeConfig
    from vllm.transformers_utils.config import get_config

    try:
        target = get_config(str(checkpoint_dir), trust_remote_code=True)
        draft = get_config(
            str(checkpoint_dir), trust_remote_code=True, hf_overrides_fn=SpeculativeConfig.hf_config_override
        )
        inspect_in_process(*dict.fromkeys([*target.architectures, *draft.architectures]))
    except Exception:  # noqa: BLE001 (vLLM reports it when it builds the model)
        return


def mtp_vllm_config(
    checkpoint_dir: Path, speculative_options: dict | None = None, cache_options: dict | None = None
):
    """The VllmConfig of a one-token MTP run on the checkpoint (no tokenizer, no weights read), made as a
    user's engine makes it (EngineArgs): the engine's defaults that follow from the model and the CPU
    (prefix caching, for one) are what the draft is built under."""
    from vllm.engine.arg_utils import EngineArgs

    inspect_mtp_classes_in_process(checkpoint_dir)
    engine_args = EngineArgs(
        model=str(checkpoint_dir),
        trust_remote_code=True,  # the engineered checkpoints' remote config classes, as the engine runs load
        skip_tokenizer_init=True,
        max_model_len=256,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1, **(speculative_options or {})},
        **(cache_options or {}),
    )
    return engine_args.create_engine_config()


def has_draft_quant_config() -> bool:
    """Whether this vLLM has the series' draft_quant_config option (stock vLLM has not)."""
    from vllm.config import SpeculativeConfig

    return "draft_quant_config" in SpeculativeConfig.__dataclass_fields__


def draft_quant_decision(vllm_config) -> str | None:
    """What draft_quant_config resolved to, as one string: "unquantized" or "target" (the v0.33.0 series'
    decision, or the v0.22.1 series' when its MTP layer and block agree), "mtp_layer=X block=Y" for the
    v0.22.1 series' split decision; None under stock vLLM."""
    decision = getattr(vllm_config.speculative_config, "draft_quant_decision", None)
    if decision is None or isinstance(decision, str):
        return decision
    if decision.mtp_layer == decision.block:
        return decision.mtp_layer
    return f"mtp_layer={decision.mtp_layer} block={decision.block}"


def init_single_process_distributed() -> None:
    """A one-rank gloo process group: parallel linears need one to be built."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            backend="gloo",
        )
        initialize_model_parallel(tensor_model_parallel_size=1)


def draft_vllm_config(vllm_config):
    """What the proposer builds the draft with: the series' draft config (v0.33.0 series:
    with_draft_quant_config, v0.22.1 series: mtp_draft_vllm_config); stock vLLM passes vllm_config
    as is."""
    from vllm.model_executor.models import utils

    for name in ("with_draft_quant_config", "mtp_draft_vllm_config"):
        if hasattr(utils, name):
            return getattr(utils, name)(vllm_config)
    return vllm_config


def build_mtp_draft(
    checkpoint_dir: Path,
    stand_ins: Iterable[contextlib.AbstractContextManager] = (),
    cache_dtype: str | None = None,
    speculative_options: dict | None = None,
    after_target_loading: Callable[[object], None] | None = None,
    cache_options: dict | None = None,
):
    """(draft, vllm_config): the MTP draft built on CPU as the proposer builds it, with
    ``stand_ins`` (context managers replacing CUDA-bound pieces) active while it is built;
    ``after_target_loading(vllm_config)`` sees the configs as the target left them."""
    from vllm.model_executor.model_loader.utils import (
        configure_quant_config,
        get_model_architecture,
        initialize_model,
    )
    from vllm.utils.torch_utils import set_default_torch_dtype

    vllm_config = mtp_vllm_config(checkpoint_dir, speculative_options, cache_options)
    if cache_dtype is not None:
        vllm_config.cache_config.cache_dtype = cache_dtype
    draft_model_config = vllm_config.speculative_config.draft_model_config
    # Target loading runs first and adapts the quant config the draft may share.
    if vllm_config.quant_config is not None:
        target_class, _ = get_model_architecture(vllm_config.model_config)
        configure_quant_config(vllm_config.quant_config, target_class)
    if after_target_loading is not None:
        after_target_loading(vllm_config)

    with contextlib.ExitStack() as stack:
        for stand_in in stand_ins:
            stack.enter_context(stand_in)
        stack.enter_context(set_default_torch_dtype(draft_model_config.dtype))
        stack.enter_context(torch.device("cpu"))
        draft = initialize_model(vllm_config=draft_vllm_config(vllm_config), model_config=draft_model_config)
    return draft, vllm_config


def load_mtp_draft_weights(draft, vllm_config) -> set[str]:
    """Load the checkpoint into the draft as the engine's default loader does (with its checks);
    the names of the parameters the draft's load_weights reports as loaded."""
    from vllm.config import set_current_vllm_config
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    loaded = set()
    load_weights = draft.load_weights

    def recording_load_weights(weights):
        names = load_weights(weights)
        loaded.update(names or ())
        return names

    draft_model_config = vllm_config.speculative_config.draft_model_config
    with (
        set_current_vllm_config(vllm_config),
        mock.patch.object(draft, "load_weights", recording_load_weights),
    ):
        DefaultModelLoader(LoadConfig()).load_weights(draft, draft_model_config)
    return loaded


def describe_linears(draft: torch.nn.Module) -> dict[str, str]:
    """Quant method class of every module of the draft that has one (linears, MoE experts,
    embeddings and heads, attention's KV cache), and of plain torch Linears."""
    described = {}
    for name, module in draft.named_modules():
        if (quant_method := getattr(module, "quant_method", None)) is not None:
            described[name] = type(quant_method).__name__
        elif isinstance(module, torch.nn.Linear):
            # Some drafters build eh_proj as a plain torch Linear: never quantized.
            described[name] = "torch.nn.Linear"
    return described


def failure(error: BaseException) -> dict:
    """A probe scenario's failure, reported rather than raised."""
    return {"error_type": type(error).__name__, "error": str(error)}


def build_and_load(
    checkpoint_dir: Path,
    stand_ins: Callable[[], Iterable[contextlib.AbstractContextManager]] = kernel_choice_stand_ins,
    speculative_options: dict | None = None,
    cache_dtype: str | None = None,
    load_failure: Callable[[Exception], dict] = failure,
    after_load: Callable[[torch.nn.Module], dict] | None = None,
) -> dict:
    """Build the draft, describe it and load it: ``{"build": failure}`` when construction raises, else
    the decision, the quant method of every linear, and ``"load"``: "ok" (with the parameters no
    checkpoint tensor reached, ``"unloaded"``) or ``load_failure(error)``; ``after_load(draft)``'s
    findings go under ``"after_load"``."""
    try:
        draft, vllm_config = build_mtp_draft(checkpoint_dir, stand_ins(), cache_dtype, speculative_options)
    # Any failure is a finding to report, not a probe crash.
    except Exception as exc:  # noqa: BLE001
        return {"build": failure(exc)}
    result = {"draft_quant_decision": draft_quant_decision(vllm_config), "linears": describe_linears(draft)}
    try:
        loaded = load_mtp_draft_weights(draft, vllm_config)
    except Exception as exc:  # noqa: BLE001
        result["load"] = load_failure(exc)
        return result
    result["load"] = "ok"
    result["unloaded"] = sorted({name for name, _ in draft.named_parameters()} - loaded)
    if after_load is not None:
        result["after_load"] = after_load(draft)
    return result
