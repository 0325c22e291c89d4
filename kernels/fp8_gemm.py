"""The W8A8 GEMM: fp8 operands, float32 accumulation, one scale per row of each operand."""
import torch

from gdserve.kernels.triton import use_triton

# Rows up to which the Triton kernel beats torch._scaled_mm's row-wise kernel on an H200 at
# Llama-3-8B's shapes (scripts/fp8_gemm_gpu.py; figures in docs/benchmarks.md).
TRITON_MAX_ROWS = 128


def fp8_gemm_reference(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                       out_dtype: torch.dtype) -> torch.Tensor:
    """a [M, K], w [N, K] float8_e4m3fn; a_scale [M, 1], w_scale [1, N] float32 -> [M, N] out_dtype."""
    return (a.float() @ w.float().t() * a_scale * w_scale).to(out_dtype)


def fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
             out_dtype: torch.dtype) -> torch.Tensor:
    """fp8_gemm_reference on fp8 tensor cores. On CUDA: Triton for few rows, and for any output but
    bf16 (torch._scaled_mm's row-wise kernel, CUTLASS, writes only bf16: a float32 model would lose
    its precision there); torch._scaled_mm for the rest, and for everything on the CPU."""
    if use_triton(a, "fp8_gemm") and (a.shape[0] <= TRITON_MAX_ROWS or out_dtype != torch.bfloat16):
        from gdserve.kernels.triton.fp8_gemm import fp8_gemm_triton
        return fp8_gemm_triton(a, a_scale, w, w_scale, out_dtype)
    gemm_dtype = torch.bfloat16 if a.is_cuda else out_dtype
    return torch._scaled_mm(a, w.t(), scale_a=a_scale, scale_b=w_scale, out_dtype=gemm_dtype).to(out_dtype)
