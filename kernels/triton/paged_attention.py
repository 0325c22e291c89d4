"""Paged attention for CUDA: split-K decode (+ a reduce over the splits) and causal prefill chunks.

Both read K/V in place from caches laid out [num_blocks, block_size, KVH, D]: a tile of BLOCK_N
tokens may span several cache blocks, so each token row finds its block through the block table.
The caches may be fp8 (e4m3 / e5m2, scale 1.0): the dots then run in float16, which holds every
fp8 value exactly (widening to bfloat16 instead measured 0.87-0.95x the bf16 cache's decode speed
on an H200, float16 1.1x: at half the bytes, the memory does not bound it there). With FP8_MATH
(an e4m3 cache; prefill chunks) the scores' dot runs in fp8, at twice float16's tensor-core rate:
each query row quantized with its own scale (its largest magnitude to 448), the cache's keys as
stored (kernels/fp8_attention.py is the same math in torch). P.V stays in float16: an fp8 dot
takes its second operand with the summed dimension contiguous, which V's tile is not, and the
transpose Triton adds for it measured slower than the float16 dot. Decode keeps its float16 dots:
its 16-row tiles run mma.sync, which Triton gives no fp8 form on sm_90 (it would widen the operands
to float16 anyway), and a decode step is bound by reading the cache, not by its dots.
Softmax runs in base 2 with the scale folded into log2(e).
"""
import torch
import triton
import triton.language as tl

from gdserve.kernels import fp8_attention
from gdserve.kernels.fp8 import is_fp8

_LOG2E = 1.4426950408889634
_FP8_MAX = tl.constexpr(fp8_attention.FP8_MAX)
MAX_SPLITS = 64  # decode split-K: the partial results are [S, H, splits, D] floats


@triton.jit
def _kv_rows(table_row_ptr, tok, valid, kv_head, stride_b, stride_t, stride_h, PAGE: tl.constexpr):
    """Offsets of the tokens `tok` of one sequence and KV head in a cache, each found through the
    block table (read once per tile, for K and V both)."""
    page = tl.load(table_row_ptr + tok // PAGE, mask=valid, other=0).to(tl.int64)
    return page * stride_b + (tok % PAGE) * stride_t + kv_head * stride_h


@triton.jit
def _attend_tile(q, s_mask, rows, valid, k_cache_ptr, v_cache_ptr, score_scale, m, l, acc,
                 HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, FP8_MATH: tl.constexpr,
                 MASK: tl.constexpr = True):
    """One tile of keys (cache rows `rows`, 0 where not valid) in the online softmax (base 2):
    returns the updated (max, sum, acc). score_scale: what turns q.k into base-2 scores, a scalar
    or a [rows, 1] column (with FP8_MATH). MASK=False: every score of the tile is visible
    (s_mask unused)."""
    d = tl.arange(0, HEAD_DIM)
    k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    if not FP8_MATH:
        k = k.to(q.dtype)  # an fp8 cache widens to the queries' float16
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * score_scale
    if MASK:
        s = tl.where(s_mask, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
    if FP8_MATH:  # q is e4m3 here: P.V in float16
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return m_new, l * alpha + tl.sum(p, 1), acc


@triton.jit
def _dot_operand(q, FP8_CACHE: tl.constexpr):
    """The queries in the dots' type: float16 over an fp8 cache (clamped to its range), else as is."""
    if FP8_CACHE:
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    return q


@triton.jit
def _fp8_queries(q):
    """(each row of q in e4m3 with its largest magnitude at 448, the rows' scales)."""
    q = q.to(tl.float32)
    row_scale = tl.maximum(tl.max(tl.abs(q), 1), 1e-30) / _FP8_MAX  # a padded row is all zeros
    return tl.clamp(q / row_scale[:, None], -_FP8_MAX, _FP8_MAX).to(tl.float8e4nv), row_scale


# Arguments that change from step to step are not specialized on (value 1, divisibility by 16,
# pointer alignment): each would compile another variant of the kernel, ~1 s each, mid-serving.
# A split is given in tiles, so the compiler sees that its first key is a multiple of BLOCK_N.
# No branch skips a split that starts past its sequence's end: its loop is empty and the reduce
# never reads what it writes. Such a branch around the body measured 1.07-1.15x slower on an
# H200 (fp8 cache, batch 115-1,024, contexts 192-4,000, timed as CUDA graph replays).
@triton.jit(do_not_specialize=["tiles_per_split", "stride_tab", "max_splits"])
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, seq_lens_ptr, out_ptr,
                   part_out_ptr, part_lse_ptr, scale_log2, tiles_per_split,
                   stride_qs, stride_qh, stride_os, stride_oh, stride_tab,
                   stride_cb, stride_ct, stride_ch, max_splits,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                   PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, FP8_CACHE: tl.constexpr):
    """One program: one sequence, one KV head with its GROUP query heads, one split of the context."""
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    if SPLIT:
        start = split * tiles_per_split * BLOCK_N
        end = tl.minimum(start + tiles_per_split * BLOCK_N, seq_len)
    else:
        start = 0
        end = seq_len
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
                mask=g[:, None] < GROUP, other=0.0)
    q = _dot_operand(q, FP8_CACHE)
    table_row = tables_ptr + seq.to(tl.int64) * stride_tab
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        valid = tok < end
        rows = _kv_rows(table_row, tok, valid, kv_head, stride_cb, stride_ct, stride_ch, PAGE)
        m, l, acc = _attend_tile(q, valid[None, :], rows, valid, k_cache_ptr, v_cache_ptr, scale_log2,
                                 m, l, acc, HEAD_DIM, DOT_PRECISION, FP8_MATH=False)
    l = tl.maximum(l, 1.0)  # >= 1 after any key (the largest score adds exp2(0)); an empty split's is 0
    out = acc / l[:, None]
    if SPLIT:  # partial results, normalized, with their log-sum-exp (base 2) for the reduce
        part = (seq * (GROUP * tl.num_programs(1)) + heads) * max_splits + split
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], out, mask=g[:, None] < GROUP)
        tl.store(part_lse_ptr + part, m + tl.log2(l), mask=g < GROUP)
    else:
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g[:, None] < GROUP)


@triton.jit(do_not_specialize=["partition_size", "max_splits"])
def _reduce_kernel(part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr, partition_size, max_splits,
                   stride_os, stride_oh, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """Combine a (sequence, head)'s splits, weighting each by its share of the softmax mass."""
    seq, head = tl.program_id(0), tl.program_id(1)
    num_splits = tl.cdiv(tl.load(seq_lens_ptr + seq), partition_size)  # later splits never ran
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    base = (seq * tl.num_programs(1) + head) * max_splits
    lse = tl.load(part_lse_ptr + base + sp, mask=sp < num_splits, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    w = w / tl.sum(w, 0)
    part = tl.load(part_out_ptr + (base + sp)[:, None] * HEAD_DIM + d[None, :],
                   mask=(sp < num_splits)[:, None], other=0.0)
    out = tl.sum(part * w[:, None], 0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["stride_tab"],
            do_not_specialize_on_alignment=["tables_ptr", "seq_lens_ptr", "query_start_ptr"])  # sliced per step
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, seq_lens_ptr, query_start_ptr, out_ptr,
                    scale_log2, stride_qt, stride_qh, stride_ot, stride_oh, stride_tab,
                    stride_cb, stride_ct, stride_ch,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    FP8_CACHE: tl.constexpr, FP8_MATH: tl.constexpr):
    """One program: BLOCK_M query rows of one chunk and one head. The chunk's rows are the last
    query_len of seq_len positions, so row r sees keys 0 .. seq_len - query_len + r."""
    chunk, tile, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(query_start_ptr + chunk)
    q_len = tl.load(query_start_ptr + chunk + 1) - q_start
    m0 = tile * BLOCK_M
    if m0 < q_len:
        seq_len = tl.load(seq_lens_ptr + chunk)
        context = seq_len - q_len
        kv_head = head // GROUP
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < q_len
        d = tl.arange(0, HEAD_DIM)
        tokens = (q_start + rows).to(tl.int64)
        q = tl.load(q_ptr + tokens[:, None] * stride_qt + head * stride_qh + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        if FP8_MATH:  # each row's scale folded into its scores'
            q, row_scale = _fp8_queries(q)
            score_scale = (row_scale * scale_log2)[:, None]
        else:
            q = _dot_operand(q, FP8_CACHE)
            score_scale = scale_log2
        table_row = tables_ptr + chunk.to(tl.int64) * stride_tab
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        end = tl.minimum(seq_len, context + m0 + BLOCK_M)  # the tile's last row sees no further
        # Key tiles wholly at or before the first row's position are visible to every row: no mask.
        # Tile 0 holds key 0, which every row sees: m is finite after it.
        unmasked_end = (context + m0 + 1) // BLOCK_N * BLOCK_N
        for n0 in range(0, unmasked_end, BLOCK_N):
            tok = n0 + tl.arange(0, BLOCK_N)
            valid = tok < end
            kv = _kv_rows(table_row, tok, valid, kv_head, stride_cb, stride_ct, stride_ch, PAGE)
            m, l, acc = _attend_tile(q, None, kv, valid, k_cache_ptr, v_cache_ptr, score_scale, m, l, acc,
                                     HEAD_DIM, DOT_PRECISION, FP8_MATH, MASK=False)
        for n0 in range(unmasked_end, end, BLOCK_N):
            tok = n0 + tl.arange(0, BLOCK_N)
            valid = tok < end
            causal = tok[None, :] <= context + rows[:, None]
            kv = _kv_rows(table_row, tok, valid, kv_head, stride_cb, stride_ct, stride_ch, PAGE)
            m, l, acc = _attend_tile(q, causal & valid[None, :], kv, valid, k_cache_ptr, v_cache_ptr,
                                     score_scale, m, l, acc, HEAD_DIM, DOT_PRECISION, FP8_MATH)
        out = acc / l[:, None]
        tl.store(out_ptr + tokens[:, None] * stride_ot + head * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# Decode tiles (tokens, warps, stages): over a 16-bit cache; over an fp8 one, by split-K or not.
_BF16_TILE = (64, 4, 4)
_FP8_TILES = {False: (64, 1, 1), True: (128, 4, 2)}


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs


def _check_fp8_math(fp8_math: bool, k_cache: torch.Tensor, head_dim: int) -> None:
    if fp8_math and (k_cache.dtype != torch.float8_e4m3fn or head_dim < fp8_attention.MIN_HEAD_DIM):
        raise ValueError(f"fp8 attention math needs an e4m3 cache and head_dim >= {fp8_attention.MIN_HEAD_DIM} "
                         f"(fp8 dots take 32 values a step), not {k_cache.dtype} and {head_dim}")


def _cache_strides(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int]:
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    return k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _partition_size(num_seqs: int, num_kv_heads: int, max_len: int, block_n: int, num_sms: int) -> int:
    """Tokens per split: one split where the grid already fills the GPU (measured on an H200 with
    ragged contexts: one split 80% of copy bandwidth, 256-token splits 65%), else enough splits to
    give it about two programs per SM (at most MAX_SPLITS); a multiple of block_n."""
    programs = num_seqs * num_kv_heads
    splits = 1 if programs >= num_sms else min(triton.cdiv(2 * num_sms, programs), MAX_SPLITS)
    return triton.cdiv(triton.cdiv(max_len, splits), block_n) * block_n


def decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int,
                            scale: float, out: torch.Tensor | None = None,
                            partition_size: int | None = None, block_n: int | None = None,
                            num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """q: [S, H, D] (one token per sequence); max_len >= every seq_len. partition_size splits
    each context into pieces of that many tokens, rounded up to a multiple of the tile's block_n
    (None: chosen from the GPU's size). The tiles' defaults are the fastest of those the kernel
    tests have passed with at real shapes on an H200 (make test-gpu;
    scripts/decode_attention_gpu.py): over a 16-bit cache 64 tokens, 4 warps, 4 stages; over an
    fp8 one, split-K 128 tokens, 4 warps, 2 stages (batch 256, context 1024), and where one split
    fills the GPU 64 tokens, 1 warp, 1 stage (batch 512-1024, contexts 192-3072: 1.2-1.5x faster
    than the split-K tile there)."""
    fp8 = is_fp8(k_cache.dtype)
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    if partition_size is None:
        partition_size = _partition_size(num_seqs, num_kv_heads, max_len, block_n or (128 if fp8 else 64),
                                         _num_sms(q.device))
    tile = _FP8_TILES[partition_size < max_len] if fp8 else _BF16_TILE
    block_n, num_warps, num_stages = block_n or tile[0], num_warps or tile[1], num_stages or tile[2]
    tiles_per_split = triton.cdiv(partition_size, block_n)
    partition_size = tiles_per_split * block_n
    splits = triton.cdiv(max_len, partition_size)
    group = num_heads // num_kv_heads
    part_out = part_lse = out  # unused without splits
    if splits > 1:
        part_out = torch.empty(num_seqs, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=q.device)
    _decode_kernel[(num_seqs, num_kv_heads, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse, scale * _LOG2E,
        tiles_per_split, q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *_cache_strides(k_cache, v_cache), splits,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, PAGE=page,
        BLOCK_N=block_n, SPLIT=splits > 1, DOT_PRECISION=_dot_precision(q.dtype),
        FP8_CACHE=fp8, num_warps=num_warps, num_stages=num_stages)
    if splits > 1:
        _reduce_kernel[(num_seqs, num_heads)](
            part_out, part_lse, seq_lens, out, partition_size, splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, SPLITS_PAD=triton.next_power_of_2(splits))
    return out


def prefill_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             block_tables: torch.Tensor, seq_lens: torch.Tensor,
                             query_start_loc: torch.Tensor, max_query_len: int, scale: float,
                             out: torch.Tensor, block_m: int = 64, block_n: int = 64,
                             num_warps: int = 4, num_stages: int = 2, fp8_math: bool = False) -> torch.Tensor:
    """Chunk i's queries are q rows query_start_loc[i]:query_start_loc[i+1] (absolute rows of
    q and out, [T, H, D]); block_tables / seq_lens: [C, ...] / [C] for the C chunks.
    fp8_math: the scores' dot in fp8 over an e4m3 cache (the module's docstring)."""
    num_chunks = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    _check_fp8_math(fp8_math, k_cache, head_dim)
    group = num_heads // k_cache.shape[2]
    if num_chunks == 0:
        return out
    grid = (num_chunks, triton.cdiv(max_query_len, block_m), num_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *_cache_strides(k_cache, v_cache),
        GROUP=group, HEAD_DIM=head_dim, PAGE=k_cache.shape[1], BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION=_dot_precision(q.dtype), FP8_CACHE=is_fp8(k_cache.dtype), FP8_MATH=fp8_math,
        num_warps=num_warps, num_stages=num_stages)
    return out
