import torch

from gdserve.kernels.fp8 import is_fp8
from gdserve.kernels.triton import use_triton


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' K/V at their slots. key/value: [T, KVH, D];
    caches: [num_blocks, block_size, KVH, D]; slot_mapping: [T] int64 (block * block_size + offset).
    An fp8 cache stores the values rounded to nearest, saturated at the format's largest finite
    value (a plain cast would turn what lies past it into NaN, or inf for e5m2)."""
    if use_triton(key, "kv_cache"):
        from gdserve.kernels.triton.kv_cache import write_kv_cache_triton
        return write_kv_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    for new, cache in ((key, k_cache), (value, v_cache)):
        rows = cache.view(-1, *new.shape[1:])
        rows.index_put_((slot_mapping,), to_cache_dtype(new, cache.dtype))  # index_copy_ has no fp8 on CPU


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not is_fp8(dtype):
        return x.to(dtype)
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype)
