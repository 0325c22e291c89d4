"""Compute kernels. Each op has a torch reference (the portable path); the CPU path runs native
C kernels from csrc/ where a compiler is available; CUDA tensors go to the Triton kernels in
triton/ (imported only then)."""
from gdserve.kernels.activation import silu_and_mul
from gdserve.kernels.bitmask import apply_token_bitmask
from gdserve.kernels.kv_cache import write_kv_cache
from gdserve.kernels.paged_attention import paged_attention
from gdserve.kernels.rms_norm import rms_norm
from gdserve.kernels.rotary import apply_rotary
from gdserve.kernels.sampling import gumbel_argmax

__all__ = ["apply_rotary", "apply_token_bitmask", "gumbel_argmax", "paged_attention", "rms_norm", "silu_and_mul",
           "write_kv_cache"]
