"""Triton kernels for CUDA tensors, one file per op; the public ops in gdserve.kernels dispatch here.
Nothing in this package imports triton at import time: CPU-only installs never load it."""
import importlib.util
from functools import cache

import torch


@cache
def available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor) -> bool:
    """Whether the op on `t` goes to Triton: CUDA tensors, where triton is installed."""
    return t.is_cuda and available()
