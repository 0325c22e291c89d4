import torch
import torch.nn.functional as F

from gdserve.kernels import native
from gdserve.kernels.quant import quant_fp8_rowwise
from gdserve.kernels.triton import use_triton


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * I] (gate then up) -> [..., I]"""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu_and_mul_reference in one pass: Triton on CUDA, native C on the CPU, where the layout allows."""
    if use_triton(x, "silu_and_mul") and x.dim() == 2 and x.stride(1) == 1:
        from gdserve.kernels.triton.activation import silu_and_mul_triton
        return silu_and_mul_triton(x)
    kernel = native.kernel("silu_and_mul", x)
    if kernel is None or not x.is_contiguous():
        return silu_and_mul_reference(x)
    inter = x.shape[-1] // 2
    out = x.new_empty(*x.shape[:-1], inter)
    kernel(native.ptr(x), native.ptr(out), x.numel() // x.shape[-1], inter, torch.get_num_threads())
    return out


def silu_and_mul_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quant_fp8_rowwise(silu_and_mul(x)): for an fp8 linear layer, in one kernel on CUDA."""
    if use_triton(x, "silu_and_mul") and x.dim() == 2 and x.stride(1) == 1:
        from gdserve.kernels.triton.activation import silu_and_mul_quant_fp8_triton
        return silu_and_mul_quant_fp8_triton(x)
    return quant_fp8_rowwise(silu_and_mul(x))
