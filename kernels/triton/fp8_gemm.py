"""W8A8 fp8 GEMM with row-wise scales for few rows (decode steps): out[m, n] = (sum_k a[m, k] w[n, k])
* a_scale[m] * w_scale[n]. torch._scaled_mm's row-wise kernel (CUTLASS) runs at a third to a half
of the weights' read bandwidth below ~256 rows; this one streams the weight once, in tiles spread
over the SMs (split over K where N alone gives too few)."""
import torch
import triton
import triton.language as tl

from gdserve.kernels.triton.fp8_gemm_configs import Config, config_for
from gdserve.kernels.triton.split_k import split_k_buffers, store_tile


@triton.jit
def _fp8_gemm_kernel(a_ptr, w_ptr, out_ptr, sums_ptr, lock_ptr, a_scale_ptr, w_scale_ptr, M, N, K, stride_am, stride_wn, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                     EVEN_K: tl.constexpr, PROMOTE_EVERY: tl.constexpr):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    w_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None]   # [BLOCK_K, BLOCK_N], K contiguous
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(pid_k * BLOCK_K, K, SPLIT_K * BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs + k, mask=rm[:, None] < M, other=0.0)
            w = tl.load(w_ptrs + k, mask=rn[None, :] < N, other=0.0)
        else:
            a = tl.load(a_ptrs + k, mask=(rm[:, None] < M) & (k + rk[None, :] < K), other=0.0)
            w = tl.load(w_ptrs + k, mask=(rn[None, :] < N) & (k + rk[:, None] < K), other=0.0)
        # Hopper's fp8 MMAs accumulate with fewer bits than float32 (Triton's default on sm_90
        # never corrects it: errors ~1% over K = 14336); add the partial sums into a float32
        # accumulator every PROMOTE_EVERY products, as CUTLASS does every 128.
        acc = tl.dot(a, w, acc, max_num_imprecise_acc=PROMOTE_EVERY)
    a_scale = tl.load(a_scale_ptr + rm, mask=rm < M, other=0.0)
    w_scale = tl.load(w_scale_ptr + rn, mask=rn < N, other=0.0)
    acc = acc * a_scale[:, None] * w_scale[None, :]
    out_ptrs = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    sums_ptrs = sums_ptr + rm[:, None].to(tl.int64) * N + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    store_tile(out_ptrs, acc, mask, sums_ptrs, lock_ptr + pid_m * tl.num_programs(0) + pid_n, SPLIT_K)


def fp8_gemm_triton(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                    out_dtype: torch.dtype, config: Config | None = None) -> torch.Tensor:
    """a [M, K] and w [N, K] float8_e4m3fn (K contiguous), a_scale [M, 1], w_scale [1, N] float32;
    config: the tiles (default: config_for the shape)."""
    assert a.stride(1) == 1 and w.stride(1) == 1 and a.shape[1] == w.shape[1]
    (M, K), N = a.shape, w.shape[0]
    block_m, block_n, block_k, split_k, warps, stages = config or config_for(M, N, K, a.device)
    out = torch.empty(M, N, dtype=out_dtype, device=a.device)
    if M:
        grid = (triton.cdiv(N, block_n), triton.cdiv(M, block_m), split_k)
        sums, locks = split_k_buffers(out, grid[0] * grid[1], split_k)
        _fp8_gemm_kernel[grid](a, w, out, sums, locks, a_scale, w_scale, M, N, K, a.stride(0), w.stride(0), out.stride(0),
                               BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
                               EVEN_K=K % block_k == 0, PROMOTE_EVERY=min(block_k, 128),
                               num_warps=warps, num_stages=stages)
    return out
