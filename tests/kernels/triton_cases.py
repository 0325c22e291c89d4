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
