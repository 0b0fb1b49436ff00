"""The plain-torch MLA stand-in (mla_stand_in.py) against vLLM's own MLA code where it runs on the CPU:
the decode kernel torch.ops._C.mla_decode_kvcache (both test beds' CPU builds have it), vLLM 0.32.0's CPU
MLA cache write (cpu_mla.py), and the prefill/decode identity vLLM's MLA relies on (weight absorption)."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.checkpoints import MLA_SIZES, NUM_ATTENTION_HEADS, causal_attention
from tests.mla_stand_in import absorb, decode, expand_latent, prefill, write_latent_cache

ENTRY = MLA_SIZES.kv_lora_rank + MLA_SIZES.qk_rope_head_dim  # the CPU decode kernel's only size
BLOCK_SIZE = 16  # the CPU platform's block size for MLA
SCALE = MLA_SIZES.qk_head_dim**-0.5


def _paged_cache(generator: torch.Generator, seq_lens: list[int]):
    """A random cache and shuffled block tables: sequence i owns blocks enough for seq_lens[i]."""
    per_sequence = max(-(-length // BLOCK_SIZE) for length in seq_lens)
    blocks = torch.randperm(per_sequence * len(seq_lens), generator=generator)
    block_tables = blocks.view(len(seq_lens), per_sequence).to(torch.int32)
    kv_cache = torch.randn(len(blocks), BLOCK_SIZE, ENTRY, generator=generator)
    return kv_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_is_vllms_cpu_decode_kernel(dtype):
    from vllm import _custom_ops as ops

    generator = torch.Generator().manual_seed(0)
    kv_cache, block_tables, seq_lens = _paged_cache(generator, [1, 17, 40])
    query = torch.randn(len(seq_lens), NUM_ATTENTION_HEADS, ENTRY, generator=generator)
    kv_cache, query = kv_cache.to(dtype), query.to(dtype)
    expected = torch.zeros(len(seq_lens), NUM_ATTENTION_HEADS, MLA_SIZES.kv_lora_rank, dtype=dtype)
    ops.mla_decode_kvcache_cpu(expected, query, kv_cache, SCALE, block_tables, seq_lens)
    got = decode(query, kv_cache, SCALE, block_tables, seq_lens, MLA_SIZES.kv_lora_rank)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)
    # A stand-in that ignored the block table would differ from the kernel.
    unshuffled = torch.arange(block_tables.numel(), dtype=torch.int32).view_as(block_tables)
    wrong = decode(query, kv_cache, SCALE, unshuffled, seq_lens, MLA_SIZES.kv_lora_rank)
    assert not torch.allclose(wrong, expected, atol=tolerance, rtol=tolerance)


def test_cache_write_is_vllms_cpu_mla_cache_write():
    try:
        cpu_mla = importlib.import_module("vllm.v1.attention.backends.mla.cpu_mla")
    except ImportError:
        pytest.skip(
            "this vLLM's CPU build has no MLA cache write to compare with (vLLM 0.32.0's cpu_mla has)"
        )
    generator = torch.Generator().manual_seed(1)
    kv_c = torch.randn(5, MLA_SIZES.kv_lora_rank, generator=generator)
    k_pe = torch.randn(5, 1, MLA_SIZES.qk_rope_head_dim, generator=generator)
    slots = torch.tensor([3, 17, -1, 40, 0])
    expected, got = torch.zeros(4, BLOCK_SIZE, ENTRY), torch.zeros(4, BLOCK_SIZE, ENTRY)
    # do_kv_cache_update reads nothing of its instance.
    cpu_mla.CPUMLAImpl.do_kv_cache_update(None, kv_c, k_pe, expected, slots, "auto", torch.tensor(1.0))
    write_latent_cache(kv_c, k_pe, got, slots)
    assert torch.equal(got, expected)
    assert got.count_nonzero() == 4 * ENTRY


def test_prefill_is_the_engineered_references_attention():
    generator = torch.Generator().manual_seed(2)
    q, k = (torch.randn(7, NUM_ATTENTION_HEADS, MLA_SIZES.qk_head_dim, generator=generator) for _ in "qk")
    v = torch.randn(7, NUM_ATTENTION_HEADS, MLA_SIZES.v_head_dim, generator=generator)
    torch.testing.assert_close(prefill(q, k, v, SCALE), causal_attention(q, k, v, SCALE))


def test_absorbed_decode_attends_as_unabsorbed_prefill():
    """Each token's decode over the cached latent, W_UV applied, is its row of the prompt's prefill: the
    identity that lets vLLM prefill unabsorbed and decode absorbed."""
    generator = torch.Generator().manual_seed(3)
    tokens, heads, sizes = 9, NUM_ATTENTION_HEADS, MLA_SIZES
    kv_c = torch.randn(tokens, sizes.kv_lora_rank, generator=generator) / sizes.kv_lora_rank**0.5
    k_pe = torch.randn(tokens, 1, sizes.qk_rope_head_dim, generator=generator)
    kv_b_proj = torch.randn(
        heads * (sizes.qk_nope_head_dim + sizes.v_head_dim), sizes.kv_lora_rank, generator=generator
    )
    q = torch.randn(tokens, heads, sizes.qk_head_dim, generator=generator)
    q_nope, q_pe = q.split([sizes.qk_nope_head_dim, sizes.qk_rope_head_dim], dim=-1)

    k, v = expand_latent(kv_c, k_pe, kv_b_proj, heads, sizes.v_head_dim)
    unabsorbed = prefill(q, k, v, SCALE)

    kv_cache = torch.zeros(1, BLOCK_SIZE, ENTRY)
    write_latent_cache(kv_c, k_pe, kv_cache, torch.arange(tokens))
    ql_nope, w_uv = absorb(q_nope, kv_b_proj, heads, sizes.v_head_dim)
    query = torch.cat([ql_nope, q_pe], dim=-1)
    block_tables = torch.zeros(1, 1, dtype=torch.int32)
    for token in range(tokens):
        seq_lens = torch.tensor([token + 1], dtype=torch.int32)
        latent = decode(query[token : token + 1], kv_cache, SCALE, block_tables, seq_lens, sizes.kv_lora_rank)
        absorbed = torch.einsum("bhl,hlv->bhv", latent, w_uv)
        torch.testing.assert_close(absorbed[0], unabsorbed[token], atol=1e-4, rtol=1e-4)
