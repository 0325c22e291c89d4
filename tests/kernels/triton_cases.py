"""Shared by the test_triton_* files. On CUDA (make test-gpu) the kernels run compiled at real
shapes; elsewhere under the interpreter (conftest.py sets it up) at small ones."""
import importlib.util

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if ON_CUDA else "cpu"

requires_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                     reason="triton is not installed (pip install -e '.[gpu]')")


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def bf16_tol() -> dict:
    """An ulp or two of bfloat16: the compiled kernels contract a*b + c into one FMA (one rounding
    where torch has two; seen on the H200), and the interpreter casts float32 to bfloat16 by
    truncation. The float32 runs are the precise check."""
    return dict(atol=6e-2, rtol=2e-2)


def assert_same_fp8_rows(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor],
                         min_identical: float = 0.8) -> None:
    """Two quant_fp8_rowwise results of values computed two ways (a norm's or an activation's,
    whose last bits may differ between kernels: the interpreter truncates to bf16, twice in a
    SiLU-and-mul): scales within two bf16 steps, each value within one fp8 step of that, and most
    codes the same."""
    (q, scale), (q_ref, scale_ref) = actual, expected
    assert q.dtype == q_ref.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape
    torch.testing.assert_close(scale, scale_ref, atol=0, rtol=2 ** -6)
    value, value_ref = q.float() * scale, q_ref.float() * scale_ref
    assert ((value - value_ref).abs() <= value_ref.abs() * (2 ** -3 + 2 ** -5) + scale_ref * 2 ** -9).all()
    assert (q.view(torch.uint8) == q_ref.view(torch.uint8)).float().mean() >= min_identical
