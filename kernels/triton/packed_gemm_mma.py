"""The packed GEMM over 4-bit weights in the mma layout (kernels/packed_gemm.py, to_mma).

A program computes a tile out^T [BLOCK_N, BLOCK_M] = W^T x^T: W's rows of N are the tensor
cores' first operand, taken from registers, and x's rows the second, from shared memory, so a
decode step's few rows fill the small side of the multiply (swap AB). Each thread loads its
weight words in 16-byte runs and unpacks them with masks, shifts and joins alone into its operand
registers (the layout is made for that), as 16-bit floats by the exponent trick: code q under
the bits of 128.0 (bfloat16) or 1024.0 (float16) reads as 128 + q or 1024 + q, exactly.

With a tile's factored sums (MmaConfig's last field; the default's for up to 32 rows a tile) and
a tile of 128 values of K within one group, the codes are multiplied as they are and the
group's scale and bias applied to the tile's sums:
    sum_k x (q s + b) = s * sum_k x (OFFSET + q) + (b - OFFSET s) * sum_k x,
x's sums by a dot with an operand of ones (the tensor cores are idle at few rows). Otherwise each
weight is dequantized in float32, a scale and bias per word of codes, and rounded to x's dtype
first, as the reference does (a sum of x across threads would cost more than that)."""
import torch
import triton
import triton.language as tl

from gdserve.kernels.triton.packed_gemm import exact_float
from gdserve.kernels.triton.split_k import split_k_buffers, store_tile
from gdserve.kernels.triton.packed_gemm_configs import MmaConfig, mma_config_for

TILE_K = 128
_MAGIC = {torch.bfloat16: (0x4300, 128.0), torch.float16: (0x6400, 1024.0)}


@triton.jit
def _nibble_pairs(words, MAGIC: tl.constexpr):
    """words int32 [BLOCK_N, 4 (t), 4 (w)] -> int32 [BLOCK_N, t, w, 2 (a), 2 (c)], each holding
    two codes, of k = 32 w + 8 c + 2 t + a (low half) and of k + 16 (high half), each as
    MAGIC | q: the bits of a 16-bit float that reads OFFSET + q (q itself where MAGIC is 0)."""
    shifted = tl.join(words, words >> 4)
    shifted = tl.join(shifted, shifted >> 8)
    return (shifted & 0x000F000F) | (MAGIC * 0x10001)


@triton.jit
def _split_pairs(pairs):
    """[..., a, c] of two 16-bit halves -> int32 [..., a, c, 2 (e)]: e 0 the low half."""
    return tl.join(pairs & 0xFFFF, (pairs >> 16) & 0xFFFF)


@triton.jit
def _as_halves(pairs, like):
    """_nibble_pairs' words as the two 16-bit floats each holds: [..., a, c, 2 (e)] of like's dtype."""
    return _split_pairs(pairs).to(tl.int16).to(like.dtype, bitcast=True)


@triton.jit
def _k_order(values):
    """[BLOCK_N, t, w, a, c, e] -> [BLOCK_N, 128] with k = 32 w + 16 e + 8 c + 2 t + a: a
    relabelling of each thread's registers (the tensor cores' operand layout), no data moves."""
    return tl.reshape(tl.permute(values, (0, 2, 5, 4, 1, 3)), (values.shape[0], 128))


@triton.jit
def _packed_gemm_mma_kernel(x_ptr, q_ptr, s_ptr, b_ptr, out_ptr, sums_ptr, lock_ptr, M, N, K, stride_xm,
                            stride_om,
                            GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FACTORED_TILES: tl.constexpr,
                            MAGIC: tl.constexpr, OFFSET: tl.constexpr):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rw = tl.arange(0, 4)
    n_mask, m_mask = rn < N, rm < M
    words_a_row = tl.cdiv(K, BLOCK_K) * (BLOCK_K // 8)
    q_ptrs = q_ptr + rn[:, None, None].to(tl.int64) * words_a_row + \
        tl.arange(0, 4)[None, :, None] * 4 + rw[None, None, :]
    x_ptrs = x_ptr + rm[None, :].to(tl.int64) * stride_xm + rk[:, None]
    PRECISION: tl.constexpr = "ieee" if MAGIC == 0 else "tf32"
    FACTORED: tl.constexpr = FACTORED_TILES and GROUP_SIZE % BLOCK_K == 0
    PER_WORD: tl.constexpr = GROUP_SIZE % BLOCK_K == 0 or (BLOCK_K % GROUP_SIZE == 0 and GROUP_SIZE >= 32)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(pid_k * BLOCK_K, K, SPLIT_K * BLOCK_K):
        words = tl.load(q_ptrs + k // 8, mask=n_mask[:, None, None], other=0)
        xt = tl.load(x_ptrs + k, mask=m_mask[None, :] & (k + rk[:, None] < K), other=0.0)  # [BLOCK_K, BLOCK_M]
        if FACTORED:  # few rows, one group a tile: the codes go to the tensor cores as they are
            if MAGIC == 0:
                codes = _k_order(exact_float(_split_pairs(_nibble_pairs(words, 0))))
            else:
                codes = _k_order(_as_halves(_nibble_pairs(words, MAGIC), xt))
            part = tl.dot(codes, xt, input_precision=PRECISION)
            # x's sums, by the tensor cores (idle at few rows), straight into part's layout
            x_sum = tl.dot(tl.full((BLOCK_N, BLOCK_K), 1.0, tl.float32).to(xt.dtype), xt, input_precision=PRECISION)
            g = k // GROUP_SIZE
            scale = tl.load(s_ptr + g * N + rn, mask=n_mask, other=0.0).to(tl.float32)
            bias = tl.load(b_ptr + g * N + rn, mask=n_mask, other=0.0).to(tl.float32)
            acc += part * scale[:, None] + (bias - OFFSET * scale)[:, None] * x_sum
        elif PER_WORD:  # a group a word or more: each word's codes scaled before the dot
            sb_offsets = ((k + rw * 32) // GROUP_SIZE)[None, :] * N + rn[:, None]  # [BLOCK_N, w]
            sb_mask = n_mask[:, None] & (k + rw[None, :] * 32 < K)
            scale = tl.load(s_ptr + sb_offsets, mask=sb_mask, other=0.0).to(tl.float32)
            bias = tl.load(b_ptr + sb_offsets, mask=sb_mask, other=0.0).to(tl.float32)
            q = exact_float(_split_pairs(_nibble_pairs(words, 0)))
            w = q * scale[:, None, :, None, None, None] + bias[:, None, :, None, None, None]
            acc = tl.dot(_k_order(w).to(xt.dtype), xt, acc, input_precision=PRECISION)
        else:  # any other group size: a scale and bias gathered per weight
            q = _k_order(exact_float(_split_pairs(_nibble_pairs(words, 0))))
            sb_offsets = ((k + rk) // GROUP_SIZE)[None, :] * N + rn[:, None]
            sb_mask = n_mask[:, None] & (k + rk[None, :] < K)
            scale = tl.load(s_ptr + sb_offsets, mask=sb_mask, other=0.0).to(tl.float32)
            bias = tl.load(b_ptr + sb_offsets, mask=sb_mask, other=0.0).to(tl.float32)
            acc = tl.dot((q * scale + bias).to(xt.dtype), xt, acc, input_precision=PRECISION)
    out_ptrs = out_ptr + rm[None, :].to(tl.int64) * stride_om + rn[:, None]
    sums_ptrs = sums_ptr + rm[None, :].to(tl.int64) * N + rn[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    store_tile(out_ptrs, acc, mask, sums_ptrs, lock_ptr + pid_m * tl.num_programs(0) + pid_n, SPLIT_K)


@triton.jit
def _dequantize_mma_kernel(q_ptr, s_ptr, b_ptr, out_ptr, N, K, GROUP_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """W^T [N, K] (nn.Linear's weight) from the mma layout, a tile of 128 values of K a program."""
    BLOCK_K: tl.constexpr = 128
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.program_id(1) * BLOCK_K
    rk = k + tl.arange(0, BLOCK_K)
    words_a_row = tl.cdiv(K, BLOCK_K) * (BLOCK_K // 8)
    n_mask = rn < N
    words = tl.load(q_ptr + rn[:, None, None].to(tl.int64) * words_a_row + k // 8 +
                    tl.arange(0, 4)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :],
                    mask=n_mask[:, None, None], other=0)
    q = _k_order(exact_float(_split_pairs(_nibble_pairs(words, 0))))
    mask = n_mask[:, None] & (rk[None, :] < K)
    g_offsets = (rk // GROUP_SIZE)[None, :] * N + rn[:, None]
    scale = tl.load(s_ptr + g_offsets, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(b_ptr + g_offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], (q * scale + bias).to(out_ptr.dtype.element_ty),
             mask=mask)


def dequantize_mma_triton(qweight: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                          group_size: int) -> torch.Tensor:
    """W^T [N, K] in the scales' dtype: the PackedWeight's dequantize, transposed."""
    N, K = qweight.shape[0], scales.shape[0] * group_size
    out = torch.empty(N, K, dtype=scales.dtype, device=qweight.device)
    block_n = 64
    _dequantize_mma_kernel[(triton.cdiv(N, block_n), triton.cdiv(K, TILE_K))](
        qweight, scales, biases, out, N, K, GROUP_SIZE=group_size, BLOCK_N=block_n, num_warps=4)
    return out


def packed_gemm_mma_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                           group_size: int, config: MmaConfig | None = None) -> torch.Tensor:
    """x [M, K] (bf16, fp16 or fp32, K contiguous) @ the 4-bit PackedWeight of these fields in
    the mma layout -> [M, N] in x.dtype. config (an MmaConfig) runs the fused kernel at any M;
    default: mma_config_for, or, where it gives None (many rows), cuBLAS on the weight
    dequantized."""
    assert x.stride(1) == 1 and qweight.is_contiguous() and scales.is_contiguous() and biases.is_contiguous()
    (M, K), N = x.shape, qweight.shape[0]
    if config is None:
        config = mma_config_for(M, N, K, group_size, x.device)
        if config is None:
            return torch.nn.functional.linear(x, dequantize_mma_triton(qweight, scales, biases, group_size))
    block_m, block_n, split_k, warps, stages, factored = config
    if block_n % 64:
        # Built for the warpgroup MMA, whose register operand is 64 rows of N; below that the
        # compiler picks another MMA, and there the factored sums came out wrong on an H100.
        raise ValueError(f"the mma kernel takes BLOCK_N a multiple of 64, got {block_n}")
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if not M:
        return out
    magic, offset = _MAGIC.get(x.dtype, (0, 0.0))
    grid = (triton.cdiv(N, block_n), triton.cdiv(M, block_m), split_k)
    sums, locks = split_k_buffers(out, grid[0] * grid[1], split_k)
    _packed_gemm_mma_kernel[grid](x, qweight, scales, biases, out, sums, locks, M, N, K, x.stride(0), out.stride(0),
                                  GROUP_SIZE=group_size, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=TILE_K,
                                  SPLIT_K=split_k, FACTORED_TILES=factored,
                                  MAGIC=magic, OFFSET=offset, num_warps=warps,
                                  num_stages=stages)
    return out
