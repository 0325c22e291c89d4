"""SiLU(gate) * up in one pass over [T, 2 * I] (the reference reads and writes the gate twice).
Rounds as the torch reference (and HF) do: silu to the input dtype, then the product."""
import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_rows"])
def _silu_and_mul_kernel(x_ptr, out_ptr, num_rows, inter, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (silu * up.to(tl.float32)).to(gate.dtype), mask=mask)


def silu_and_mul_triton(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """x: [T, 2 * I], rows contiguous -> [T, I]"""
    assert x.dim() == 2 and x.stride(1) == 1
    num_rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_rows, inter, dtype=x.dtype, device=x.device)
    if num_rows:
        _silu_and_mul_kernel[(num_rows, triton.cdiv(inter, block))](
            x, out, num_rows, inter, x.stride(0), out.stride(0), BLOCK=block)
    return out
