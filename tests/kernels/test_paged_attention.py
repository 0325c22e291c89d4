import math

import pytest
import torch

from gdserve.kernels import paged_attention, write_kv_cache


def naive_attention(q, k, v, scale):
    """q: [Q, H, D] are the last Q positions of k/v: [L, KVH, D]; explicit softmax, no SDPA."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    offset = k.shape[0] - q.shape[0]
    causal = torch.arange(k.shape[0])[None, :] <= (torch.arange(q.shape[0])[:, None] + offset)
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def build_case(query_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, seed=0):
    """Scatter each sequence's K/V over shuffled blocks; return the inputs and dense K/V."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g).tolist()
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    tables, dense, q_parts, new_kv, slots = [], [], [], [], []
    for q_len, s_len, nb in zip(query_lens, seq_lens, blocks_per_seq):
        table = [perm.pop() for _ in range(nb)]
        tables.append(table + [0] * (max(blocks_per_seq) - nb))
        k = torch.randn(s_len, num_kv_heads, head_dim, generator=g)
        v = torch.randn(s_len, num_kv_heads, head_dim, generator=g)
        # Past tokens already in the cache; the new ones arrive through write_kv_cache.
        for p in range(s_len):
            slot = (table[p // block_size], p % block_size)
            if p < s_len - q_len:
                k_cache[slot], v_cache[slot] = k[p], v[p]
            else:
                slots.append(slot[0] * block_size + slot[1])
        new_kv.append((k[s_len - q_len:], v[s_len - q_len:]))
        dense.append((k, v))
        q_parts.append(torch.randn(q_len, num_heads, head_dim, generator=g))
    new_k = torch.cat([kv[0] for kv in new_kv])
    new_v = torch.cat([kv[1] for kv in new_kv])
    write_kv_cache(new_k, new_v, k_cache, v_cache, torch.tensor(slots))
    return torch.cat(q_parts), k_cache, v_cache, torch.tensor(tables, dtype=torch.int32), dense


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 1), (8, 2), (8, 1)])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_mixed_batch_matches_naive(num_heads, num_kv_heads, head_dim):
    # Decodes first (one query token each), then prefill chunks: whole prompts and continuations
    # whose context crosses block boundaries, short ones (attended as decode rows on the CPU) and
    # longer ones (gathered) mixed.
    query_lens = [1, 1, 1, 7, 16, 5, 24, 17, 2]
    seq_lens = [1, 17, 33, 7, 16, 21, 40, 17, 50]
    q, k_cache, v_cache, tables, dense = build_case(query_lens, seq_lens, num_heads, num_kv_heads, head_dim, 8)
    scale = head_dim ** -0.5
    out = paged_attention(q, k_cache, v_cache, tables, torch.tensor(seq_lens), query_lens, seq_lens, 3, scale)
    start = 0
    for q_len, (k, v) in zip(query_lens, dense):
        expected = naive_attention(q[start:start + q_len], k, v, scale)
        torch.testing.assert_close(out[start:start + q_len], expected, atol=1e-5, rtol=1e-4)
        start += q_len


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_matches_naive_on_its_values(kv_dtype, dtype):
    """An fp8 cache (on the CPU the reference widens what it gathers) against naive attention
    over the same rounded K/V."""
    query_lens, seq_lens = [1, 1, 9, 4], [3, 40, 9, 21]
    q, k_cache, v_cache, tables, dense = build_case(query_lens, seq_lens, 8, 2, 32, 8, seed=3)
    k_cache, v_cache = k_cache.to(kv_dtype), v_cache.to(kv_dtype)  # randn: inside both ranges
    q = q.to(dtype)
    out = paged_attention(q, k_cache, v_cache, tables, torch.tensor(seq_lens), query_lens, seq_lens, 2, 0.2)
    assert out.dtype == dtype
    start = 0
    for q_len, (k, v) in zip(query_lens, dense):
        k, v = k.to(kv_dtype).to(dtype), v.to(kv_dtype).to(dtype)
        expected = naive_attention(q[start:start + q_len].float(), k.float(), v.float(), 0.2)
        tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out[start:start + q_len].float(), expected, **tol)
        start += q_len


def test_decode_only_and_prefill_only_batches():
    for query_lens, seq_lens, num_decodes in [([1, 1, 1], [5, 40, 16], 3), ([12, 3], [12, 30], 0)]:
        q, k_cache, v_cache, tables, dense = build_case(query_lens, seq_lens, 6, 2, 32, 16, seed=1)
        out = paged_attention(q, k_cache, v_cache, tables, torch.tensor(seq_lens), query_lens, seq_lens,
                              num_decodes, 0.2)
        start = 0
        for q_len, (k, v) in zip(query_lens, dense):
            torch.testing.assert_close(out[start:start + q_len], naive_attention(q[start:start + q_len], k, v, 0.2),
                                       atol=1e-5, rtol=1e-4)
            start += q_len


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn, torch.float8_e5m2])
def test_write_kv_cache_places_tokens_at_slots(cache_dtype):
    k_cache = torch.zeros(4, 4, 2, 8, dtype=cache_dtype)
    v_cache = torch.zeros(4, 4, 2, 8, dtype=cache_dtype)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    key[2, 0, 0] = 1e6  # past fp8 e4m3's range: saturates
    write_kv_cache(key, value, k_cache, v_cache, torch.tensor([13, 2, 7]))
    limit = torch.finfo(cache_dtype).max
    torch.testing.assert_close(k_cache[3, 1], key[0].to(cache_dtype))
    torch.testing.assert_close(v_cache[0, 2], value[1].to(cache_dtype))
    torch.testing.assert_close(k_cache[1, 3], key[2].clamp(-limit, limit).to(cache_dtype))
    assert k_cache.float().abs().sum(dim=(-1, -2)).count_nonzero() == 3


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (4, 4, 16), (8, 1, 32)])
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn, torch.float8_e5m2])
def test_native_decode_matches_reference(dtype, tol, num_heads, num_kv_heads, head_dim, kv_dtype):
    from gdserve.kernels.paged_attention import (decode_attention_native, decode_attention_reference,
                                                 native_decode_available)
    seq_lens = [1, 15, 16, 17, 64, 130]
    q, k_cache, v_cache, tables, _ = build_case([1] * len(seq_lens), seq_lens, num_heads, num_kv_heads,
                                                head_dim, 16, seed=2)
    q, k_cache, v_cache = q.to(dtype), k_cache.to(kv_dtype or dtype), v_cache.to(kv_dtype or dtype)
    if kv_dtype is not None:  # every fp8 value, subnormals and the extremes included, somewhere
        values = torch.arange(256, dtype=torch.uint8).view(kv_dtype)
        values = values[values.float().isfinite()].to(torch.float32)
        k_cache.view(-1)[:len(values)] = values.to(kv_dtype)
        v_cache.view(-1)[-len(values):] = values.flip(0).to(kv_dtype)
    if not native_decode_available(q, k_cache):
        pytest.skip("no C compiler for the native CPU kernels")
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    expected = decode_attention_reference(q, k_cache, v_cache, tables, lens, seq_lens, 0.125)
    out = decode_attention_native(q, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
