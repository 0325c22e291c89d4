"""Attention over a paged KV cache for a flat, mixed batch of decodes and prefill chunks.

Sequence i owns query rows query_start_loc[i]:query_start_loc[i+1] (its new tokens) and attends
causally over its first seq_lens[i] cached tokens, found through block_tables[i]. The new tokens
are the last query_len of those, so row j of a chunk may see keys up to seq_len - query_len + j.
"""
import ctypes

import torch
import torch.nn.functional as F

from gdserve.kernels import native
from gdserve.kernels.fp8 import is_fp8
from gdserve.kernels.fp8_attention import MIN_HEAD_DIM, fp8_attention
from gdserve.kernels.triton import use_triton

_DECODE_GROUP = 16


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache.index_select(0, block_table[:num_blocks])  # [nb, bs, KVH, D]
    return blocks.flatten(0, 1)[:seq_len]                      # [L, KVH, D]


def _attention(q, k, v, scale, fp8_math, mask=None, is_causal=False):
    """SDPA, or fp8_attention with fp8_math; q: [1, heads, Q, D], k/v: [1, KV heads, L, D];
    mask: [Q, L], True where a key is seen."""
    if not fp8_math:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=True)
    q = q.unflatten(1, (k.shape[1], -1))                                 # [1, KVH, G, Q, D]
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    out = fp8_attention(q, k.unsqueeze(2), v.unsqueeze(2), scale, mask)
    return out.flatten(1, 2).to(q.dtype)


def _decode_attention_padded(q, k_cache, v_cache, block_tables, seq_lens, max_len, scale):
    """All rows are single-token decodes: one padded, masked SDPA for the whole batch."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_blocks = (max_len + block_size - 1) // block_size
    blocks = block_tables[:, :num_blocks].flatten()
    padded_len = num_blocks * block_size
    # .to: an fp8 cache's values widen to the queries' type (a no-op for a cache of that type)
    k = k_cache.index_select(0, blocks).to(q.dtype).view(num_seqs, padded_len, num_kv_heads, head_dim)
    v = v_cache.index_select(0, blocks).to(q.dtype).view(num_seqs, padded_len, num_kv_heads, head_dim)
    # The G query heads sharing a KV head take the place of the query length: no repeat of K/V.
    q = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)   # [S, KVH, G, D]
    valid = torch.arange(padded_len, device=q.device)[None, :] < seq_lens[:, None]
    out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),  # [S, KVH, L, D]
                                         attn_mask=valid[:, None, None, :], scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def _chunk_attention(q, k, v, scale, fp8_math):
    """q: [Q, H, D] are the last Q of the L positions in k/v: [L, KVH, D]."""
    num_q, seq_len = q.shape[0], k.shape[0]
    # 4-D inputs take the CPU flash kernel; 3-D ones fall back to the (much slower) math path.
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))      # [1, heads, len, D]
    if num_q == seq_len:
        out = _attention(qh, kh, vh, scale, fp8_math, is_causal=True)
    else:
        rows = torch.arange(num_q, device=q.device)[:, None] + (seq_len - num_q)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= rows  # [Q, L]
        out = _attention(qh, kh, vh, scale, fp8_math, mask=mask)
    return out[0].transpose(0, 1)                                       # [Q, H, D]


def decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens_tensor: torch.Tensor,
                               seq_lens: list[int], scale: float) -> torch.Tensor:
    """q: [S, H, D], one query token per sequence. Decodes go in groups, each padded to its own
    longest context: with the caller's decodes sorted by length, this halves the padded work."""
    out = torch.empty_like(q)
    for i in range(0, q.shape[0], _DECODE_GROUP):
        j = min(i + _DECODE_GROUP, q.shape[0])
        out[i:j] = _decode_attention_padded(q[i:j], k_cache, v_cache, block_tables[i:j],
                                            seq_lens_tensor[i:j], max(seq_lens[i:j]), scale)
    return out


def native_decode_available(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return native.kernel("paged_decode_attention", q, k_cache.dtype) is not None


def decode_attention_native(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, seq_lens_tensor: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """The same as decode_attention_reference, reading the cache blocks in place (csrc/)."""
    kernel = native.kernel("paged_decode_attention", q, k_cache.dtype)
    q = q.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens_tensor = seq_lens_tensor.to(torch.int32).contiguous()
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.dtype == v_cache.dtype
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    ptr = native.ptr
    kernel(ptr(q), ptr(k_cache), ptr(v_cache), ptr(block_tables), ptr(seq_lens_tensor), ptr(out),
           num_seqs, num_heads, num_kv_heads, head_dim, block_size, block_tables.shape[1],
           ctypes.c_float(scale), torch.get_num_threads())
    return out


def _triton_ok(query: torch.Tensor, k_cache: torch.Tensor, fp8_math: bool) -> bool:
    head_dim = query.shape[-1]
    return use_triton(query, "paged_attention") and head_dim >= 16 and head_dim & (head_dim - 1) == 0 and \
        (k_cache.dtype == query.dtype or is_fp8(k_cache.dtype)) and k_cache.stride(3) == 1 and \
        (not fp8_math or head_dim >= MIN_HEAD_DIM)


def paged_attention_triton(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens_tensor: torch.Tensor, query_lens: list[int],
                           seq_lens: list[int], num_decodes: int, scale: float,
                           query_start_loc: torch.Tensor | None = None, fp8_math: bool = False) -> torch.Tensor:
    """paged_attention on CUDA: the split-K decode kernel, then one launch over the prefill chunks."""
    from gdserve.kernels.triton.paged_attention import decode_attention_triton, prefill_attention_triton
    out = torch.empty_like(query)
    if num_decodes:
        decode_attention_triton(query[:num_decodes], k_cache, v_cache, block_tables[:num_decodes],
                                seq_lens_tensor[:num_decodes], max(seq_lens[:num_decodes]), scale,
                                out=out[:num_decodes])
    if num_decodes < len(query_lens):
        if query_start_loc is None:
            query_start_loc = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
            query_start_loc = query_start_loc.to(query.device, non_blocking=True)
        prefill_attention_triton(query, k_cache, v_cache, block_tables[num_decodes:],
                                 seq_lens_tensor[num_decodes:], query_start_loc[num_decodes:],
                                 max(query_lens[num_decodes:]), scale, out, fp8_math=fp8_math)
    return out


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens_tensor: torch.Tensor, query_lens: list[int],
                    seq_lens: list[int], num_decodes: int, scale: float,
                    query_start_loc: torch.Tensor | None = None, fp8_math: bool = False) -> torch.Tensor:
    """query: [T, H, D] flat; the first num_decodes sequences have exactly one query token.
    k_cache/v_cache: [num_blocks, block_size, KVH, D] (already holding the new tokens).
    block_tables: [S, max_blocks] int32; seq_lens_tensor: [S] (seq_lens on the device);
    query_start_loc: [S + 1] int32 on the device, the cumulative query_lens (CUDA; built if None).
    fp8_math: the prefill chunks' score dots in fp8 over an e4m3 cache (kernels/fp8_attention.py;
    decode rows keep exact dots). Returns [T, H, D]."""
    if fp8_math and k_cache.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8 attention math needs an e4m3 cache, not {k_cache.dtype}")
    if _triton_ok(query, k_cache, fp8_math):
        return paged_attention_triton(query, k_cache, v_cache, block_tables, seq_lens_tensor, query_lens,
                                      seq_lens, num_decodes, scale, query_start_loc, fp8_math)
    out = torch.empty_like(query)
    if num_decodes:
        q, tables, lens = query[:num_decodes], block_tables[:num_decodes], seq_lens_tensor[:num_decodes]
        if native_decode_available(q, k_cache):
            out[:num_decodes] = decode_attention_native(q, k_cache, v_cache, tables, lens, scale)
        else:
            out[:num_decodes] = decode_attention_reference(q, k_cache, v_cache, tables, lens,
                                                           seq_lens[:num_decodes], scale)
    start = num_decodes
    for i in range(num_decodes, len(query_lens)):
        q_len, s_len = query_lens[i], seq_lens[i]
        k = _gather_kv(k_cache, block_tables[i], s_len).to(query.dtype)
        v = _gather_kv(v_cache, block_tables[i], s_len).to(query.dtype)
        out[start:start + q_len] = _chunk_attention(query[start:start + q_len], k, v, scale, fp8_math)
        start += q_len
    return out
