"""Attention over a paged KV cache for a flat, mixed batch of decodes and prefill chunks.

Sequence i owns query rows query_start_loc[i]:query_start_loc[i+1] (its new tokens) and attends
causally over its first seq_lens[i] cached tokens, found through block_tables[i]. The new tokens
are the last query_len of those, so row j of a chunk may see keys up to seq_len - query_len + j.
"""
import torch
import torch.nn.functional as F


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache.index_select(0, block_table[:num_blocks])  # [nb, bs, KVH, D]
    return blocks.flatten(0, 1)[:seq_len]                      # [L, KVH, D]


def _decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """All rows are single-token decodes: one padded, masked SDPA for the whole batch."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    max_blocks = (max_len + block_size - 1) // block_size
    table = block_tables[:, :max_blocks].long()
    k = k_cache[table].flatten(1, 2)[:, :max_len]   # [S, L, KVH, D]
    v = v_cache[table].flatten(1, 2)[:, :max_len]
    group = num_heads // num_kv_heads
    # The G query heads sharing a KV head take the place of the query length: no repeat of K/V.
    q = q.view(num_seqs, num_kv_heads, group, head_dim)           # [S, KVH, G, D]
    k = k.transpose(1, 2)                                         # [S, KVH, L, D]
    v = v.transpose(1, 2)
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].to(q.device)
    mask = valid[:, None, None, :]                                # [S, 1, 1, L]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def _chunk_attention(q, k, v, scale):
    """q: [Q, H, D] are the last Q of the L positions in k/v: [L, KVH, D]."""
    num_q, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    qh = q.transpose(0, 1)                                             # [H, Q, D]
    kh = k.transpose(0, 1).repeat_interleave(group, dim=0)             # [H, L, D]
    vh = v.transpose(0, 1).repeat_interleave(group, dim=0)
    if num_q == seq_len:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    else:
        rows = torch.arange(num_q, device=q.device)[:, None] + (seq_len - num_q)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= rows  # [Q, L]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)                                         # [Q, H, D]


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, query_lens: list[int], seq_lens: list[int],
                    num_decodes: int, scale: float) -> torch.Tensor:
    """query: [T, H, D] flat; the first num_decodes sequences have exactly one query token.
    k_cache/v_cache: [num_blocks, block_size, KVH, D] (already holding the new tokens).
    block_tables: [S, max_blocks] int32. Returns [T, H, D]."""
    out = torch.empty_like(query)
    if num_decodes:
        seq_lens_t = torch.tensor(seq_lens[:num_decodes], device=query.device)
        out[:num_decodes] = _decode_attention(query[:num_decodes], k_cache, v_cache,
                                              block_tables[:num_decodes], seq_lens_t, scale)
    start = num_decodes
    for i in range(num_decodes, len(query_lens)):
        q_len, s_len = query_lens[i], seq_lens[i]
        k = _gather_kv(k_cache, block_tables[i], s_len)
        v = _gather_kv(v_cache, block_tables[i], s_len)
        out[start:start + q_len] = _chunk_attention(query[start:start + q_len], k, v, scale)
        start += q_len
    return out
