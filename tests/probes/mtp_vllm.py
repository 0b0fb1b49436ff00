"""What the construction probes share: a quantization config vLLM's CPU backend can build, the vLLM
configs the engine derives from a checkpoint directory for an MTP draft, and building that draft on
CPU the way the proposer does."""

import contextlib
import socket
from collections.abc import Iterable
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


def mtp_vllm_config(checkpoint_dir: Path, speculative_options: dict | None = None):
    """The VllmConfig of a one-token MTP run on the checkpoint (no tokenizer, no weights read)."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    model_config = ModelConfig(model=str(checkpoint_dir), skip_tokenizer_init=True, max_model_len=256)
    speculative_config = SpeculativeConfig(
        method="mtp",
        num_speculative_tokens=1,
        target_model_config=model_config,
        target_parallel_config=ParallelConfig(),
        **(speculative_options or {}),
    )
    return VllmConfig(model_config=model_config, speculative_config=speculative_config)


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
    """What the proposer builds the draft with: stock vLLM passes vllm_config as is."""
    try:
        from vllm.model_executor.models.utils import mtp_draft_vllm_config
    except ImportError:
        return vllm_config
    return mtp_draft_vllm_config(vllm_config)


def build_mtp_draft(
    checkpoint_dir: Path,
    stand_ins: Iterable[contextlib.AbstractContextManager] = (),
    cache_dtype: str | None = None,
    speculative_options: dict | None = None,
):
    """(draft, vllm_config): the MTP draft built on CPU as the proposer builds it, with
    ``stand_ins`` (context managers replacing CUDA-bound pieces) active while it is built."""
    from vllm.model_executor.model_loader.utils import (
        configure_quant_config,
        get_model_architecture,
        initialize_model,
    )
    from vllm.utils.torch_utils import set_default_torch_dtype

    vllm_config = mtp_vllm_config(checkpoint_dir, speculative_options)
    if cache_dtype is not None:
        vllm_config.cache_config.cache_dtype = cache_dtype
    draft_model_config = vllm_config.speculative_config.draft_model_config
    # Target loading runs first and adapts the quant config the draft may share.
    target_class, _ = get_model_architecture(vllm_config.model_config)
    configure_quant_config(vllm_config.quant_config, target_class)

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
