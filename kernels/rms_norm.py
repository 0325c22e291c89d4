import ctypes

import torch

from gdserve.kernels import native
from gdserve.kernels.quant import quant_fp8_rowwise
from gdserve.kernels.triton import use_triton


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None):
    """Without residual: norm(x) * weight. With it: (norm(x + residual) * weight, x + residual).
    The variance is taken in float32 and the normed value cast back before the weight, as
    transformers does."""
    if residual is not None:
        x = x + residual
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(x.dtype)
    return out if residual is None else (out, x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             quant_fp8: bool = False):
    """rms_norm_reference in one pass (Triton on CUDA, native C on the CPU) where the dtypes and
    layout allow; the residual is then updated in place. With quant_fp8 the normed output comes as
    quant_fp8_rowwise's (q, scale), quantized in the same pass on CUDA."""
    if use_triton(x, "rms_norm") and weight.dtype == x.dtype and x.dim() == 2 and x.stride(1) == 1 and \
            (residual is None or residual.stride(1) == 1):
        from gdserve.kernels.triton.rms_norm import rms_norm_triton
        return rms_norm_triton(x, weight, eps, residual, quant_fp8)
    result = _rms_norm_without_triton(x, weight, eps, residual)
    if not quant_fp8:
        return result
    if residual is None:
        return quant_fp8_rowwise(result)
    out, residual = result
    return quant_fp8_rowwise(out), residual


def _rms_norm_without_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None):
    kernel = native.kernel("rms_norm", x)
    if kernel is None or weight.dtype != x.dtype or not x.is_contiguous() or \
            (residual is not None and not residual.is_contiguous()):
        return rms_norm_reference(x, weight, eps, residual)
    out = torch.empty_like(x)
    hidden = x.shape[-1]
    kernel(native.ptr(x), None if residual is None else native.ptr(residual), native.ptr(weight),
           native.ptr(out), x.numel() // hidden, hidden, ctypes.c_float(eps), torch.get_num_threads())
    return out if residual is None else (out, residual)
