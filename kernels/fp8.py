"""The fp8 (e4m3) format's constants, shared by the torch references and the Triton kernels."""
import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
# The scale is amax times this float32 constant, not amax / 448: torch on CUDA divides by a
# Python scalar that way, and the kernels must round as the reference does on either device.
FP8_MAX_INV = 1.0 / FP8_MAX
# An all-zero row still gets a positive, finite scale (vLLM's floor).
MIN_SCALE = 1.0 / (FP8_MAX * 512)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
