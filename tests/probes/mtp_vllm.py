"""What the construction probes share: a quantization config vLLM's CPU backend can build, and the
vLLM configs the engine derives from a checkpoint directory for an MTP draft."""

from pathlib import Path

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


def mtp_vllm_config(checkpoint_dir: Path):
    """The VllmConfig of a one-token MTP run on the checkpoint (no tokenizer, no weights read)."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    model_config = ModelConfig(model=str(checkpoint_dir), skip_tokenizer_init=True, max_model_len=256)
    speculative_config = SpeculativeConfig(
        method="mtp",
        num_speculative_tokens=1,
        target_model_config=model_config,
        target_parallel_config=ParallelConfig(),
    )
    return VllmConfig(model_config=model_config, speculative_config=speculative_config)
