"""Triton kernels for CUDA tensors, one file per op; the public ops in gdserve.kernels dispatch here.
Nothing in this package imports triton at import time: CPU-only installs never load it."""
import importlib.util
import os
from functools import cache

import torch


@cache
def available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor, op: str) -> bool:
    """Whether `op` on `t` goes to Triton: CUDA tensors, where triton is installed, unless the op
    is named in GDSERVE_NO_TRITON (comma-separated, or "all": to bisect numerics on a device)."""
    off = os.environ.get("GDSERVE_NO_TRITON", "")
    return t.is_cuda and available() and op not in off.split(",") and off != "all"
