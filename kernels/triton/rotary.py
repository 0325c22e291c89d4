"""Neox-style rotary embedding (the halves of the head dim are the complex pairs), out of place,
optionally followed by a fixed [D, D] rotation of every head's vector (fp8 attention's turn of
queries and keys) in the same pass. Each product and sum is rounded to the input dtype as the
torch reference (and HF) round them; the rotation is one tensor-core dot per block of rows,
accumulated in float32 and rounded once, as a GEMM in the input dtype rounds it."""
import torch
import triton
import triton.language as tl

BLOCK_ROWS = 64  # (token, head) rows a program: the rotation's [D, D] is loaded once for them


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, rot_ptr, out_ptr, num_rows, num_heads, stride_xt, stride_xh,
                   stride_ct, stride_st, HALF: tl.constexpr, BLOCK_R: tl.constexpr, ROTATE: tl.constexpr,
                   PRECISION: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    token, head = rows // num_heads, rows % num_heads
    d = tl.arange(0, HALF)
    mask = rows[:, None] < num_rows
    x_row = x_ptr + token[:, None] * stride_xt + head[:, None] * stride_xh + d[None, :]
    x1 = tl.load(x_row, mask=mask, other=0.0)
    x2 = tl.load(x_row + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    c = tl.load(cos_ptr + token[:, None] * stride_ct + d[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + token[:, None] * stride_st + d[None, :], mask=mask, other=0.0).to(tl.float32)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    lo = ((a * c).to(dtype).to(tl.float32) - (b * s).to(dtype).to(tl.float32)).to(dtype)
    hi = ((b * c).to(dtype).to(tl.float32) + (a * s).to(dtype).to(tl.float32)).to(dtype)
    out_row = out_ptr + rows[:, None] * 2 * HALF + d[None, :]
    if ROTATE:
        # [lo, hi] @ rot: each output half is lo @ (rot's top rows) + hi @ (its bottom rows).
        top = rot_ptr + d[:, None] * 2 * HALF + d[None, :]
        bottom = top + HALF * 2 * HALF
        out_lo = tl.dot(hi, tl.load(bottom), tl.dot(lo, tl.load(top), input_precision=PRECISION),
                        input_precision=PRECISION)
        out_hi = tl.dot(hi, tl.load(bottom + HALF), tl.dot(lo, tl.load(top + HALF), input_precision=PRECISION),
                        input_precision=PRECISION)
        lo, hi = out_lo.to(dtype), out_hi.to(dtype)
    tl.store(out_row, lo, mask=mask)
    tl.store(out_row + HALF, hi, mask=mask)


def apply_rotary_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        rotation: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, heads, D] (D contiguous); cos/sin: [T, 1, D / 2] in x's dtype; rotation: [D, D]
    contiguous in x's dtype, or None -> new [T, heads, D]."""
    num_tokens, num_heads, head_dim = x.shape
    assert x.stride(2) == 1 and cos.stride(-1) == 1 and sin.stride(-1) == 1
    if rotation is not None:
        assert rotation.shape == (head_dim, head_dim) and rotation.dtype == x.dtype and rotation.is_contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    num_rows = num_tokens * num_heads
    if num_rows:
        grid = (triton.cdiv(num_rows, BLOCK_ROWS),)
        _rotary_kernel[grid](x, cos, sin, x if rotation is None else rotation, out, num_rows, num_heads,
                             x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), HALF=head_dim // 2,
                             BLOCK_R=BLOCK_ROWS, ROTATE=rotation is not None,
                             PRECISION="ieee" if x.dtype == torch.float32 else "tf32")
    return out
