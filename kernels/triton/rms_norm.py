"""Fused (residual add +) RMSNorm, one program per row, rounding as rms_norm_reference does."""
import torch
import triton
import triton.language as tl

from gdserve.kernels.fp8 import FP8_DTYPE, FP8_MAX, FP8_MAX_INV, MIN_SCALE


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, scale_ptr, stride_x, stride_r, stride_o,
                     hidden, eps, fp8_max, fp8_max_inv, min_scale,
                     HAS_RESIDUAL: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the sum, rounded once
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    h = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    normed = (h * rstd).to(x.dtype).to(tl.float32)  # cast back before the weight, as HF does
    out = (normed * w.to(tl.float32)).to(x.dtype)
    if QUANT:  # quant_fp8_rowwise of the rounded output, for an fp8 linear layer
        y = out.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(y), axis=0) * fp8_max_inv, min_scale)
        q = tl.clamp(tl.div_rn(y, scale), -fp8_max, fp8_max)
        tl.store(out_ptr + row * stride_o + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + row, scale)
    else:
        tl.store(out_ptr + row * stride_o + cols, out, mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    residual: torch.Tensor | None = None, quant_fp8: bool = False):
    """rms_norm_reference for 2-D x (last dim contiguous); the residual is updated in place. With
    quant_fp8 the output is quant_fp8_rowwise's (q, scale) of it."""
    assert x.dim() == 2 and x.stride(1) == 1 and weight.dtype == x.dtype
    rows, hidden = x.shape
    out = torch.empty(rows, hidden, dtype=FP8_DTYPE if quant_fp8 else x.dtype, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device) if quant_fp8 else out
    if rows:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            x, x if residual is None else residual, weight, out, scale, x.stride(0),
            0 if residual is None else residual.stride(0), out.stride(0), hidden, eps,
            FP8_MAX, FP8_MAX_INV, MIN_SCALE, HAS_RESIDUAL=residual is not None, QUANT=quant_fp8,
            BLOCK=block, num_warps=min(max(block // 256, 1), 16))
    result = (out, scale) if quant_fp8 else out
    return result if residual is None else (result, residual)
