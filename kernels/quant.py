"""fp8 (e4m3) quantization with one float32 scale per row: activations per token, weights per
output channel (W8A8, as vLLM's dynamic fp8). x ~= q * scale, each row's largest |x| at +-448."""
import torch

from gdserve.kernels.fp8 import FP8_DTYPE, FP8_MAX, FP8_MAX_INV, MIN_SCALE
from gdserve.kernels.triton import use_triton


def quant_fp8_rowwise_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] float8_e4m3fn, scale [M, 1] float32), rounding to nearest even."""
    h = x.float()
    scale = (h.abs().amax(dim=-1, keepdim=True) * FP8_MAX_INV).clamp(min=MIN_SCALE)
    return (h / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quant_fp8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quant_fp8_rowwise_reference in one pass over x (Triton on CUDA)."""
    if use_triton(x, "quant_fp8") and x.dim() == 2 and x.stride(1) == 1:
        from gdserve.kernels.triton.quant import quant_fp8_rowwise_triton
        return quant_fp8_rowwise_triton(x)
    return quant_fp8_rowwise_reference(x)


def dequant_fp8_rowwise(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)
