"""Per-row fp8 quantization, one program per row, rounding as quant_fp8_rowwise_reference does."""
import torch
import triton
import triton.language as tl

from gdserve.kernels.fp8 import FP8_DTYPE, FP8_MAX, FP8_MAX_INV, MIN_SCALE


@triton.jit
def _quant_fp8_rowwise_kernel(x_ptr, q_ptr, scale_ptr, stride_x, stride_q, cols_total, fp8_max, fp8_max_inv,
                              min_scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < cols_total
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * fp8_max_inv, min_scale)
    # div_rn: IEEE division, as torch's (Triton's `/` on float32 is approximate on the GPU).
    q = tl.clamp(tl.div_rn(x, scale), -fp8_max, fp8_max)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quant_fp8_rowwise_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    assert x.dim() == 2 and x.stride(1) == 1
    rows, cols = x.shape
    q = torch.empty(rows, cols, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    if rows:
        block = triton.next_power_of_2(cols)
        _quant_fp8_rowwise_kernel[(rows,)](x, q, scale, x.stride(0), q.stride(0), cols, FP8_MAX, FP8_MAX_INV, MIN_SCALE,
                                           BLOCK=block, num_warps=min(max(block // 512, 1), 16))
    return q, scale
