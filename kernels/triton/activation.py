"""SiLU(gate) * up in one pass over [T, 2 * I] (the reference reads and writes the gate twice).
Rounds as the torch reference (and HF) do: silu to the input dtype, then the product."""
import torch
import triton
import triton.language as tl

from gdserve.kernels.fp8 import FP8_DTYPE, FP8_MAX, FP8_MAX_INV, MIN_SCALE


@triton.jit
def _silu_mul(x_ptr, row, cols, mask, inter, stride_x):
    """silu(gate) * up over the columns cols of a row, rounded to the input dtype, as float32."""
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    return (silu * up.to(tl.float32)).to(gate.dtype).to(tl.float32)


@triton.jit(do_not_specialize=["num_rows"])
def _silu_and_mul_kernel(x_ptr, out_ptr, num_rows, inter, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    h = _silu_mul(x_ptr, row, cols, mask, inter, stride_x)
    tl.store(out_ptr + row * stride_o + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_rows"])
def _silu_and_mul_quant_kernel(x_ptr, q_ptr, scale_ptr, num_rows, inter, stride_x, stride_q,
                               fp8_max, fp8_max_inv, min_scale, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    """A row per program. ONE_PASS (the row fits one block): the product stays in registers
    between its largest |value| (the scale) and the quantized store. Otherwise two passes over
    the row: the scale first, then the values again (from L2). Nothing but fp8 is written."""
    row = tl.program_id(0).to(tl.int64)
    if ONE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < inter
        h = _silu_mul(x_ptr, row, cols, mask, inter, stride_x)
        scale = tl.maximum(tl.max(tl.abs(h), axis=0) * fp8_max_inv, min_scale)
        q = tl.clamp(tl.div_rn(h, scale), -fp8_max, fp8_max)
        tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, inter, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            amax = tl.maximum(amax, tl.abs(_silu_mul(x_ptr, row, cols, cols < inter, inter, stride_x)))
        scale = tl.maximum(tl.max(amax, axis=0) * fp8_max_inv, min_scale)
        for start in range(0, inter, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < inter
            q = tl.clamp(tl.div_rn(_silu_mul(x_ptr, row, cols, mask, inter, stride_x), scale), -fp8_max, fp8_max)
            tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def silu_and_mul_triton(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """x: [T, 2 * I], rows contiguous -> [T, I]"""
    assert x.dim() == 2 and x.stride(1) == 1
    num_rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_rows, inter, dtype=x.dtype, device=x.device)
    if num_rows:
        _silu_and_mul_kernel[(num_rows, triton.cdiv(inter, block))](
            x, out, num_rows, inter, x.stride(0), out.stride(0), BLOCK=block)
    return out


# Rows up to this long are quantized in one pass (the whole row in registers, 32 values a thread
# at 16 warps); longer ones in two passes of 2,048 columns.
ONE_PASS_MAX = 16384


def silu_and_mul_quant_fp8_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quant_fp8_rowwise(silu_and_mul_reference(x)) in one kernel: x [T, 2 * I] -> ([T, I] fp8, [T, 1])."""
    assert x.dim() == 2 and x.stride(1) == 1
    num_rows, inter = x.shape[0], x.shape[1] // 2
    q = torch.empty(num_rows, inter, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(num_rows, 1, dtype=torch.float32, device=x.device)
    one_pass = inter <= ONE_PASS_MAX
    block = triton.next_power_of_2(inter) if one_pass else 2048
    if num_rows:
        _silu_and_mul_quant_kernel[(num_rows,)](x, q, scale, num_rows, inter, x.stride(0), q.stride(0),
                                                FP8_MAX, FP8_MAX_INV, MIN_SCALE, BLOCK=block, ONE_PASS=one_pass,
                                                num_warps=min(16, max(4, block // 1024)))
    return q, scale
