"""The packed-weight GEMM on CUDA (kernels/packed_gemm.py has the layout). Up to DEQUANT_MIN_ROWS
rows one kernel streams the packed weight once, unpacking each tile of int32 words in registers
into one dot's operand. Where a tile lies in one group, the sums factor as
scales * (x . q) + biases * sum(x) and q goes to the tensor cores as it is (small integers are
exact in bf16). Above that row count
the weight is dequantized to x's dtype once and cuBLAS multiplies at its full rate."""
import torch
import triton
import triton.language as tl

from gdserve.kernels.triton.packed_gemm_configs import (DEQUANT_MIN_ROWS, GEMV_MAX_ROWS, Config, GemvConfig, config_for,
                                                        gemv_config_for)
from gdserve.kernels.triton.split_k import split_k_buffers, store_tile


@triton.jit
def exact_float(q):
    """Small non-negative int32s as exact float32s: put into the mantissa of 2**23, which is then
    subtracted (two full-rate instructions where an int-to-float conversion is a quarter-rate one)."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _unpack_tile(words, BITS: tl.constexpr):
    """words int32 [BLOCK_KW, BLOCK_N] -> q float32 [BLOCK_KW * (32 // BITS), BLOCK_N], row
    kw * (32 // BITS) + j from bits j * BITS upwards of word row kw."""
    PER_WORD: tl.constexpr = 32 // BITS
    BLOCK_KW: tl.constexpr = words.shape[0]
    BLOCK_N: tl.constexpr = words.shape[1]
    shifts = tl.arange(0, PER_WORD) * BITS
    q = (words[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1)
    return exact_float(tl.reshape(q, (BLOCK_KW * PER_WORD, BLOCK_N)))


@triton.jit
def _packed_gemm_kernel(x_ptr, q_ptr, s_ptr, b_ptr, out_ptr, sums_ptr, lock_ptr, M, N, K, stride_xm, stride_om,
                        BITS: tl.constexpr, GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                        PRECISION: tl.constexpr):
    PER_WORD: tl.constexpr = 32 // BITS
    BLOCK_KW: tl.constexpr = BLOCK_K // PER_WORD
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rkw = tl.arange(0, BLOCK_KW)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
    q_ptrs = q_ptr + rkw[:, None].to(tl.int64) * N + rn[None, :]
    m_mask, n_mask = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(pid_k * BLOCK_K, K, SPLIT_K * BLOCK_K):
        kw = k // PER_WORD
        if EVEN_K:
            x = tl.load(x_ptrs + k, mask=m_mask[:, None], other=0.0)
            words = tl.load(q_ptrs + kw * N, mask=n_mask[None, :], other=0)
        else:
            x = tl.load(x_ptrs + k, mask=m_mask[:, None] & (k + rk[None, :] < K), other=0.0)
            words = tl.load(q_ptrs + kw * N, mask=(kw + rkw[:, None] < K // PER_WORD) & n_mask[None, :], other=0)
        q = _unpack_tile(words, BITS)
        if GROUP_SIZE % BLOCK_K == 0:  # one group: the codes go to the tensor cores as they are
            part = tl.dot(x, q.to(x.dtype), input_precision=PRECISION)
            x_sum = tl.sum(x.to(tl.float32), axis=1)
            g = k // GROUP_SIZE
            scale = tl.load(s_ptr + g * N + rn, mask=n_mask, other=0.0).to(tl.float32)
            bias = tl.load(b_ptr + g * N + rn, mask=n_mask, other=0.0).to(tl.float32)
            acc += part * scale[None, :] + x_sum[:, None] * bias[None, :]
        else:  # groups narrower than the tile: a scale and bias per weight
            g_offsets = ((k + rk) // GROUP_SIZE)[:, None] * N + rn[None, :]
            sb_mask = (k + rk[:, None] < K) & n_mask[None, :]
            scale = tl.load(s_ptr + g_offsets, mask=sb_mask, other=0.0).to(tl.float32)
            bias = tl.load(b_ptr + g_offsets, mask=sb_mask, other=0.0).to(tl.float32)
            acc = tl.dot(x, (q * scale + bias).to(x.dtype), acc, input_precision=PRECISION)
    out_ptrs = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    sums_ptrs = sums_ptr + rm[:, None].to(tl.int64) * N + rn[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    store_tile(out_ptrs, acc, mask, sums_ptrs, lock_ptr + pid_m * tl.num_programs(0) + pid_n, SPLIT_K)


@triton.jit
def _packed_gemv_kernel(x_ptr, q_ptr, s_ptr, b_ptr, out_ptr, sums_ptr, lock_ptr, N, K, stride_xm, stride_om,
                        BITS: tl.constexpr,
                        GROUP_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr):
    """One row of x a program: float32 multiply-adds over the j-th values of each word in turn,
    no tensor cores (at a row or few they would mostly multiply padding, and the unpacked tile's
    trip through shared memory to reach them costs more than the arithmetic)."""
    PER_WORD: tl.constexpr = 32 // BITS
    BLOCK_KW: tl.constexpr = BLOCK_K // PER_WORD
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rkw = tl.arange(0, BLOCK_KW)
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm + rkw * PER_WORD
    q_ptrs = q_ptr + rkw[:, None].to(tl.int64) * N + rn[None, :]
    n_mask = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(pid_k * BLOCK_K, K, SPLIT_K * BLOCK_K):
        kw = k // PER_WORD
        if EVEN_K:
            k_mask = rkw < BLOCK_KW
        else:
            k_mask = kw + rkw < K // PER_WORD
        words = tl.load(q_ptrs + kw * N, mask=k_mask[:, None] & n_mask[None, :], other=0)
        if GROUP_SIZE % BLOCK_K == 0:
            part = tl.zeros((BLOCK_KW, BLOCK_N), dtype=tl.float32)
            x_sum = tl.zeros((BLOCK_KW,), dtype=tl.float32)
            for j in tl.static_range(PER_WORD):
                xj = tl.load(x_row + k + j).to(tl.float32)
                part += exact_float((words >> (j * BITS)) & ((1 << BITS) - 1)) * xj[:, None]
                x_sum += xj
            g = k // GROUP_SIZE
            scale = tl.load(s_ptr + g * N + rn, mask=n_mask, other=0.0).to(tl.float32)
            bias = tl.load(b_ptr + g * N + rn, mask=n_mask, other=0.0).to(tl.float32)
            acc += tl.sum(part, axis=0) * scale + tl.sum(x_sum, axis=0) * bias
        else:  # groups narrower than the tile: a scale and bias per weight
            sb_mask = k_mask[:, None] & n_mask[None, :]
            for j in tl.static_range(PER_WORD):
                xj = tl.load(x_row + k + j, mask=k_mask, other=0.0).to(tl.float32)
                g_offsets = ((k + rkw * PER_WORD + j) // GROUP_SIZE)[:, None] * N + rn[None, :]
                scale = tl.load(s_ptr + g_offsets, mask=sb_mask, other=0.0).to(tl.float32)
                bias = tl.load(b_ptr + g_offsets, mask=sb_mask, other=0.0).to(tl.float32)
                w = exact_float((words >> (j * BITS)) & ((1 << BITS) - 1)) * scale + bias
                acc += tl.sum(w * xj[:, None], axis=0)
    out_ptrs = out_ptr + pid_m.to(tl.int64) * stride_om + rn
    sums_ptrs = sums_ptr + pid_m.to(tl.int64) * N + rn
    store_tile(out_ptrs, acc, n_mask, sums_ptrs, lock_ptr + pid_m * tl.num_programs(1) + pid_n, SPLIT_K)


@triton.jit
def _dequantize_kernel(q_ptr, s_ptr, b_ptr, out_ptr, N, K, BITS: tl.constexpr, GROUP_SIZE: tl.constexpr,
                       BLOCK_KW: tl.constexpr, BLOCK_N: tl.constexpr):
    PER_WORD: tl.constexpr = 32 // BITS
    rkw = tl.program_id(0) * BLOCK_KW + tl.arange(0, BLOCK_KW)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rkw[:, None] < K // PER_WORD) & (rn[None, :] < N)
    words = tl.load(q_ptr + rkw[:, None].to(tl.int64) * N + rn[None, :], mask=mask, other=0)
    for j in tl.static_range(PER_WORD):
        k = rkw * PER_WORD + j
        g_offsets = (k // GROUP_SIZE)[:, None].to(tl.int64) * N + rn[None, :]
        scale = tl.load(s_ptr + g_offsets, mask=mask, other=0.0).to(tl.float32)
        bias = tl.load(b_ptr + g_offsets, mask=mask, other=0.0).to(tl.float32)
        w = exact_float((words >> (j * BITS)) & ((1 << BITS) - 1)) * scale + bias
        tl.store(out_ptr + k[:, None].to(tl.int64) * N + rn[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_triton(qweight: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int,
                      group_size: int) -> torch.Tensor:
    """PackedWeight.dequantize in one pass: [K, N] in the scales' dtype."""
    (words, N), K = qweight.shape, qweight.shape[0] * (32 // bits)
    out = torch.empty(K, N, dtype=scales.dtype, device=qweight.device)
    block_kw, block_n = 16, 128
    grid = (triton.cdiv(words, block_kw), triton.cdiv(N, block_n))
    _dequantize_kernel[grid](qweight, scales, biases, out, N, K, BITS=bits, GROUP_SIZE=group_size,
                             BLOCK_KW=block_kw, BLOCK_N=block_n, num_warps=4)
    return out


def packed_gemm_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                       bits: int, group_size: int, config: Config | GemvConfig | None = None) -> torch.Tensor:
    """x [M, K] (bf16, fp16 or fp32, K contiguous) @ the PackedWeight of these fields -> [M, N] in
    x.dtype. config: a GemvConfig (4 numbers) runs the row-a-program kernel, a Config (6) the
    tiled one, at any M; default: gemv_config_for up to GEMV_MAX_ROWS rows, config_for up to
    DEQUANT_MIN_ROWS, then cuBLAS on the dequantized weight."""
    assert x.stride(1) == 1 and qweight.is_contiguous() and scales.is_contiguous() and biases.is_contiguous()
    (M, K), N = x.shape, qweight.shape[1]
    if config is None and M >= DEQUANT_MIN_ROWS:
        return x @ dequantize_triton(qweight, scales, biases, bits, group_size)
    if config is None:
        config = gemv_config_for(M, N, K, bits, group_size, x.device) if M <= GEMV_MAX_ROWS else \
            config_for(M, N, K, bits, group_size, x.device)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if not M:
        return out
    if len(config) == 4:
        block_n, block_k, split_k, warps = config
        grid = (M, triton.cdiv(N, block_n), split_k)
        sums, locks = split_k_buffers(out, grid[0] * grid[1], split_k)
        _packed_gemv_kernel[grid](x, qweight, scales, biases, out, sums, locks, N, K, x.stride(0), out.stride(0), BITS=bits,
                                  GROUP_SIZE=group_size, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
                                  EVEN_K=K % block_k == 0, num_warps=warps)
    else:
        block_m, block_n, block_k, split_k, warps, stages = config
        grid = (triton.cdiv(N, block_n), triton.cdiv(M, block_m), split_k)
        sums, locks = split_k_buffers(out, grid[0] * grid[1], split_k)
        _packed_gemm_kernel[grid](x, qweight, scales, biases, out, sums, locks, M, N, K, x.stride(0), out.stride(0),
                                  BITS=bits, GROUP_SIZE=group_size, BLOCK_M=block_m, BLOCK_N=block_n,
                                  BLOCK_K=block_k, SPLIT_K=split_k, EVEN_K=K % block_k == 0,
                                  PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                                  num_warps=warps, num_stages=stages)
    return out
