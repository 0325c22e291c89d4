"""Compute kernels. Each op has a torch reference (the CPU path); the GPU issue adds Triton
implementations beside them, dispatched by device."""
from gdserve.kernels.bitmask import apply_token_bitmask
from gdserve.kernels.kv_cache import write_kv_cache
from gdserve.kernels.paged_attention import paged_attention

__all__ = ["write_kv_cache", "paged_attention"]
