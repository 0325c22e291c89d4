"""fp8 attention math (kernels/fp8_attention.py) and paged_attention's CPU path with fp8_math."""
import pytest
import torch

from gdserve.kernels import paged_attention
from gdserve.kernels.fp8_attention import FP8_MAX, fp8_attention, quantize_rows, rotate, rotation
from tests.kernels.test_paged_attention import build_case, naive_attention


def test_quantize_rows_puts_each_rows_largest_value_at_the_top_of_e4m3():
    x = torch.randn(6, 64) * torch.tensor([1e-3, 0.1, 1.0, 10.0, 1e3, 0.0])[:, None]
    values, scale = quantize_rows(x)
    assert values.abs().amax(-1)[:5].eq(FP8_MAX).all()
    assert values[5].eq(0).all()  # an all-zero row stays zero, with no division by zero
    # within half an e4m3 step (3 mantissa bits) of each value, or of the smallest subnormal
    err = (values * scale - x).abs()
    assert (err <= x.abs() * 2 ** -4 + scale * 2 ** -9).all()


@pytest.mark.parametrize("head_dim", [64, 128, 80])  # 80: no Hadamard matrix, a random orthogonal one
def test_rotation_is_orthogonal_fixed_and_spreads_every_channel(head_dim):
    rot = rotation(head_dim)
    torch.testing.assert_close(rot @ rot.T, torch.eye(head_dim), atol=1e-5, rtol=0)
    assert torch.equal(rot, rotation(head_dim))  # every layer and process turns alike
    if head_dim & (head_dim - 1) == 0:
        torch.testing.assert_close(rot.abs(), torch.full_like(rot, head_dim ** -0.5))
    q, k = torch.randn(5, head_dim), torch.randn(7, head_dim)
    torch.testing.assert_close(rotate(q, rot) @ rotate(k, rot).T, q @ k.T, atol=1e-4, rtol=1e-5)


def test_rotation_keeps_outlier_channels_from_the_rounding():
    """Queries and keys whose scores a few channels carry (as trained models' do): fp8 math over
    turned queries and keys lands much nearer exact attention than over the raw ones."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 256, 64, generator=g), torch.randn(4, 256, 64, generator=g)
    q[..., :2] *= 12
    k[..., :2] *= 6
    v = torch.randn(4, 256, 64, generator=g)
    mask = torch.ones(256, 256, dtype=torch.bool).tril()
    exact = torch.softmax((q @ k.transpose(-1, -2) * 0.125).masked_fill(~mask, float("-inf")), -1) @ v
    rot = rotation(64)

    def worst_rows(q, k):  # the 99th percentile of the rows' relative errors
        k8, v8 = (x.to(torch.float8_e4m3fn).float() for x in (k, v))
        return ((fp8_attention(q, k8, v8, 0.125, mask) - exact).norm(dim=-1) / exact.norm(dim=-1)).quantile(0.99)
    assert worst_rows(rotate(q, rot), rotate(k, rot)) < 0.5 * worst_rows(q, k)  # measured 0.21 against 0.71


def test_equal_scores_average_the_values_exactly():
    q = torch.randn(3, 32)
    k = torch.zeros(20, 32)
    v = torch.randn(20, 32).to(torch.float8_e4m3fn).float()
    out = fp8_attention(q, k, v, 0.5)
    torch.testing.assert_close(out, v.mean(0).expand(3, -1), atol=1e-6, rtol=1e-6)


def test_masked_keys_never_count():
    q, k = torch.randn(4, 32), torch.randn(9, 32)
    v = torch.randn(9, 32)
    mask = torch.ones(4, 9, dtype=torch.bool).tril(5)  # row r sees keys 0 .. r + 5
    out = fp8_attention(q, k, v, 0.2, mask)
    v_far = v.clone()
    v_far[8] = 1e4  # seen by row 3 alone
    changed = fp8_attention(q, k, v_far, 0.2, mask)
    assert torch.equal(out[:3], changed[:3]) and not torch.equal(out[3], changed[3])


@pytest.mark.parametrize("length", [16, 300, 2048])
@pytest.mark.parametrize("q_scale", [0.5, 2.0])  # flat and peaked softmax
def test_close_to_exact_attention_on_the_same_cache(length, q_scale):
    """The error fp8 math adds to attention over an e4m3 cache, per output row: a few percent of
    the row's norm (measured 2-5% median, under 10% at the 99th percentile)."""
    g = torch.Generator().manual_seed(length)
    q = torch.randn(8, length, 64, generator=g) * q_scale
    k, v = (torch.randn(8, length, 64, generator=g).to(torch.float8_e4m3fn).float() for _ in range(2))
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    exact = torch.softmax((q @ k.transpose(-1, -2) * 0.125).masked_fill(~mask, float("-inf")), -1) @ v
    rel = (fp8_attention(q, k, v, 0.125, mask) - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert rel.median() < 0.06 and rel.quantile(0.99) < 0.15


def _per_chunk(q, dense, query_lens, fn):
    out, start = [], 0
    for q_len, (k, v) in zip(query_lens, dense):
        out.append(fn(q[start:start + q_len], k, v))
        start += q_len
    return torch.cat(out)


def fp8_chunk_reference(q, k, v, scale):
    """fp8_attention for one chunk, q: [Q, H, D] the last Q positions of k/v: [L, KVH, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).transpose(0, 1), v.repeat_interleave(group, 1).transpose(0, 1)
    mask = torch.arange(k.shape[1])[None, :] <= torch.arange(q.shape[0])[:, None] + k.shape[1] - q.shape[0]
    return fp8_attention(q.transpose(0, 1), k, v, scale, mask).transpose(0, 1)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)])
def test_cpu_path_runs_chunks_in_fp8_math_and_decodes_exactly(num_heads, num_kv_heads):
    query_lens, seq_lens = [1, 1, 9, 30, 4], [3, 40, 9, 30, 21]
    q, k_cache, v_cache, tables, dense = build_case(query_lens, seq_lens, num_heads, num_kv_heads, 64, 8, seed=7)
    k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    dense = [(k.to(torch.float8_e4m3fn).float(), v.to(torch.float8_e4m3fn).float()) for k, v in dense]
    out = paged_attention(q, k_cache, v_cache, tables, torch.tensor(seq_lens), query_lens, seq_lens, 2, 0.125,
                          fp8_math=True)
    decodes = _per_chunk(q[:2], dense[:2], [1, 1], lambda q, k, v: naive_attention(q, k, v, 0.125))
    torch.testing.assert_close(out[:2], decodes, atol=1e-5, rtol=1e-4)
    chunks = _per_chunk(q[2:], dense[2:], query_lens[2:], lambda q, k, v: fp8_chunk_reference(q, k, v, 0.125))
    torch.testing.assert_close(out[2:], chunks, atol=1e-5, rtol=1e-4)


def test_fp8_math_needs_an_e4m3_cache():
    query_lens, seq_lens = [5], [5]
    q, k_cache, v_cache, tables, _ = build_case(query_lens, seq_lens, 4, 2, 32, 8)
    for dtype in (torch.float32, torch.float8_e5m2):
        with pytest.raises(ValueError, match="e4m3"):
            paged_attention(q, k_cache.to(dtype), v_cache.to(dtype), tables, torch.tensor(seq_lens), query_lens,
                            seq_lens, 0, 0.2, fp8_math=True)
