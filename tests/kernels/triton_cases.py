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
    """For kernels that round as torch does: exact on CUDA. The interpreter casts float32 to
    bfloat16 by truncation (the GPU rounds to nearest even), so on the CPU results may be an ulp
    or two apart (more after cancellation); there the float32 runs are the precise check."""
    return dict(atol=0, rtol=0) if ON_CUDA else dict(atol=6e-2, rtol=2e-2)
