"""The Triton paged attention against the naive reference: decode (split-K or not), prefill chunks
with context before them (chunked prefill, prefix hits), and mixed batches through the dispatcher."""
import random

import pytest
import torch

from gdserve.kernels.kv_cache import to_cache_dtype
from tests.kernels.test_paged_attention import build_case, naive_attention
from tests.kernels.triton_cases import DEVICE, ON_CUDA, requires_triton

pytestmark = requires_triton
GQA = [(8, 8), (8, 2), (8, 1)] if not ON_CUDA else [(32, 32), (32, 8), (32, 4)]  # ratios 1, 4, 8
# The interpreter's tl.dot multiplies bfloat16 as raw uint16 bits: float32 there, bfloat16 on CUDA.
ATTN_DTYPE = torch.bfloat16 if ON_CUDA else torch.float32
# The cache's type: the queries' (None), or fp8, which the kernels widen after each load.
KV_DTYPES = [None, torch.float8_e4m3fn, torch.float8_e5m2]


def to_device(q, k_cache, v_cache, tables, dtype, kv_dtype=None):
    kv_dtype = kv_dtype or dtype
    return (q.to(dtype).to(DEVICE), to_cache_dtype(k_cache, kv_dtype).to(DEVICE),
            to_cache_dtype(v_cache, kv_dtype).to(DEVICE), tables.to(DEVICE))


def expected_rows(q, dense, query_lens, scale, kv_dtype=None):
    """naive_attention per sequence, in float32 on the CPU from the same (rounded) inputs."""
    out, start = [], 0
    for q_len, (k, v) in zip(query_lens, dense):
        k, v = (to_cache_dtype(x, kv_dtype or q.dtype).to(q.dtype).float() for x in (k, v))
        out.append(naive_attention(q[start:start + q_len].float().cpu(), k, v, scale))
        start += q_len
    return torch.cat(out)


def tol(dtype, kv_dtype=None):
    """Over an fp8 cache the dots run in float16, whatever the queries' type."""
    if dtype == torch.float32 and kv_dtype is None:
        return dict(atol=2e-5, rtol=1e-4)
    return dict(atol=2e-3, rtol=2e-3) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def decode_lens(page: int) -> list[int]:
    """Ragged contexts on both sides of block boundaries, with a long one for several splits."""
    if ON_CUDA:
        rng = random.Random(0)
        return [1, page - 1, page, page + 1, 4096 + 3] + [rng.randint(1, 2048) for _ in range(59)]
    return [1, page, page + 1, 3 * page + 5]


@pytest.mark.parametrize("num_heads,num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("partition", [None, 16])  # auto, and forced splits (several per sequence)
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_decode(num_heads, num_kv_heads, head_dim, partition, kv_dtype):
    from gdserve.kernels.triton.paged_attention import decode_attention_triton
    page, dtype = 16, ATTN_DTYPE
    seq_lens = decode_lens(page)
    q, k_cache, v_cache, tables, dense = build_case([1] * len(seq_lens), seq_lens, num_heads, num_kv_heads,
                                                    head_dim, page, seed=head_dim + num_kv_heads)
    q, k_cache, v_cache, tables = to_device(q, k_cache, v_cache, tables, dtype, kv_dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim ** -0.5
    kwargs = {} if ON_CUDA else dict(block_n=16)  # the interpreter: small tiles, more of them
    if partition is not None:
        kwargs["partition_size"] = partition * (16 if ON_CUDA else 1)
    out = decode_attention_triton(q, k_cache, v_cache, tables, lens, max(seq_lens), scale, **kwargs)
    expected = expected_rows(q, dense, [1] * len(seq_lens), scale, kv_dtype)
    torch.testing.assert_close(out.float().cpu(), expected, **tol(dtype, kv_dtype))


def prefill_case(page: int) -> tuple[list[int], list[int]]:
    """(query_lens, seq_lens): whole prompts, chunks after a context (chunked prefill or a prefix
    hit) that starts inside a block or on its boundary, single-token chunks, ragged tiles."""
    if ON_CUDA:
        return [2048, 512, 1, 333, 100, 1000], [2048, 512 + 4 * page, 700, 333 + 1500, 100 + page, 1000 + 17]
    return [17, 5, 1, 9, 20], [17, 5 + 2 * page, 11, 9 + page + 3, 20 + 5]


@pytest.mark.parametrize("num_heads,num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_prefill(num_heads, num_kv_heads, head_dim, kv_dtype):
    from gdserve.kernels.triton.paged_attention import prefill_attention_triton
    page, dtype = 16, ATTN_DTYPE
    query_lens, seq_lens = prefill_case(page)
    q, k_cache, v_cache, tables, dense = build_case(query_lens, seq_lens, num_heads, num_kv_heads, head_dim,
                                                    page, seed=head_dim * num_kv_heads)
    q, k_cache, v_cache, tables = to_device(q, k_cache, v_cache, tables, dtype, kv_dtype)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32).to(DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim ** -0.5
    blocks = {} if ON_CUDA else dict(block_m=16, block_n=16)
    out = prefill_attention_triton(q, k_cache, v_cache, tables, lens, starts, max(query_lens), scale,
                                   torch.full_like(q, float("nan")), **blocks)
    expected = expected_rows(q, dense, query_lens, scale, kv_dtype)
    torch.testing.assert_close(out.float().cpu(), expected, **tol(dtype, kv_dtype))


@pytest.mark.parametrize("num_heads,num_kv_heads", GQA[1:])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_fp8_math(num_heads, num_kv_heads, head_dim):
    """fp8 scores over an e4m3 cache against the torch math they follow (kernels/fp8_attention.py).
    What is left is the output's own rounding (bfloat16 on CUDA: the mean), the probabilities'
    float16 rounding against the running maximum of the kernel's tiles rather than the row's, and
    on a GPU a query value that its division puts on the other side of an e4m3 rounding boundary
    now and then (the worst rows: 5-6% on an H100)."""
    from gdserve.kernels.triton.paged_attention import prefill_attention_triton
    from tests.kernels.test_fp8_attention import fp8_chunk_reference
    page, dtype, e4m3 = 16, ATTN_DTYPE, torch.float8_e4m3fn
    query_lens, seq_lens = prefill_case(page)
    q, k_cache, v_cache, tables, dense = build_case(query_lens, seq_lens, num_heads, num_kv_heads, head_dim,
                                                    page, seed=head_dim + num_heads)
    q, k_cache, v_cache, tables = to_device(q, k_cache, v_cache, tables, dtype, e4m3)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32).to(DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim ** -0.5
    blocks = {} if ON_CUDA else dict(block_m=16, block_n=32)  # fp8 dots take 32 keys a step
    out = prefill_attention_triton(q, k_cache, v_cache, tables, lens, starts, max(query_lens), scale,
                                   torch.full_like(q, float("nan")), fp8_math=True, **blocks)
    expected, start = [], 0
    for q_len, (k, v) in zip(query_lens, dense):
        k, v = (x.to(e4m3).float() for x in (k, v))
        expected.append(fp8_chunk_reference(q[start:start + q_len].float().cpu(), k, v, scale))
        start += q_len
    expected = torch.cat(expected)
    rel = (out.float().cpu() - expected).norm(dim=-1) / expected.norm(dim=-1)
    assert rel.mean() < (3e-3 if dtype == torch.bfloat16 else 2e-4) and rel.max() < (0.08 if dtype == torch.bfloat16 else 2e-3)


def test_prefill_fp8_math_refuses_other_caches():
    from gdserve.kernels.triton.paged_attention import prefill_attention_triton
    q, k_cache, v_cache, tables, _ = build_case([5], [5], 4, 2, 64, 16)
    q, k_cache, v_cache, tables = to_device(q, k_cache, v_cache, tables, ATTN_DTYPE, torch.float8_e5m2)
    lens = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="e4m3"):
        prefill_attention_triton(q, k_cache, v_cache, tables, lens, starts, 5, 0.1, torch.empty_like(q),
                                 fp8_math=True)


@pytest.mark.parametrize("page", [8, 16])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_mixed_batch_through_the_dispatcher(page, kv_dtype):
    """Decodes then chunks in one flat batch, query_start_loc built by the op when not given."""
    from gdserve.kernels.paged_attention import paged_attention_triton
    dtype = ATTN_DTYPE
    query_lens = [1, 1, 1, 7, 16, 5]
    seq_lens = [1, page + 1, 4 * page + 1, 7, 16, page + 21]
    q, k_cache, v_cache, tables, dense = build_case(query_lens, seq_lens, 8, 2, 64, page, seed=page)
    q, k_cache, v_cache, tables = to_device(q, k_cache, v_cache, tables, dtype, kv_dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    out = paged_attention_triton(q, k_cache, v_cache, tables, lens, query_lens, seq_lens, 3, 0.125)
    expected = expected_rows(q, dense, query_lens, 0.125, kv_dtype)
    torch.testing.assert_close(out.float().cpu(), expected, **tol(dtype, kv_dtype))


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_public_op_dispatches_on_cuda(kv_dtype):
    from gdserve.kernels import paged_attention
    query_lens, seq_lens = [1, 1, 40], [30, 300, 90]
    q, k_cache, v_cache, tables, dense = build_case(query_lens, seq_lens, 32, 8, 128, 16, seed=5)
    q, k_cache, v_cache, tables = to_device(q, k_cache, v_cache, tables, torch.bfloat16, kv_dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    out = paged_attention(q, k_cache, v_cache, tables, lens, query_lens, seq_lens, 2, 0.1)
    expected = expected_rows(q, dense, query_lens, 0.1, kv_dtype)
    torch.testing.assert_close(out.float().cpu(), expected, **tol(torch.bfloat16, kv_dtype))
