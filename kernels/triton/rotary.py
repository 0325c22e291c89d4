"""Neox-style rotary embedding (the halves of the head dim are the complex pairs), out of place.
Each product and sum is rounded to the input dtype as the torch reference (and HF) round them."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ct, stride_st,
                   num_heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, HALF)
    mask = heads[:, None] < num_heads
    x_row = x_ptr + token * stride_xt + heads[:, None] * stride_xh + d[None, :]
    x1 = tl.load(x_row, mask=mask, other=0.0)
    x2 = tl.load(x_row + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    c = tl.load(cos_ptr + token * stride_ct + d)[None, :].to(tl.float32)
    s = tl.load(sin_ptr + token * stride_st + d)[None, :].to(tl.float32)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    lo = (a * c).to(dtype).to(tl.float32) - (b * s).to(dtype).to(tl.float32)
    hi = (b * c).to(dtype).to(tl.float32) + (a * s).to(dtype).to(tl.float32)
    out_row = out_ptr + token * num_heads * 2 * HALF + heads[:, None] * 2 * HALF + d[None, :]
    tl.store(out_row, lo.to(dtype), mask=mask)
    tl.store(out_row + HALF, hi.to(dtype), mask=mask)


def apply_rotary_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D] (D contiguous); cos/sin: [T, 1, D / 2] in x's dtype -> new [T, heads, D]."""
    num_tokens, num_heads, head_dim = x.shape
    assert x.stride(2) == 1 and cos.stride(-1) == 1 and sin.stride(-1) == 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_h = min(triton.next_power_of_2(num_heads), 16)
    if num_tokens:
        grid = (num_tokens, triton.cdiv(num_heads, block_h))
        _rotary_kernel[grid](x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
                             num_heads, HALF=head_dim // 2, BLOCK_H=block_h)
    return out
