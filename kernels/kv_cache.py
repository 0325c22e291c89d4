import torch

from gdserve.kernels.triton import use_triton


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' K/V at their slots. key/value: [T, KVH, D];
    caches: [num_blocks, block_size, KVH, D]; slot_mapping: [T] int64 (block * block_size + offset)."""
    if use_triton(key, "kv_cache"):
        from gdserve.kernels.triton.kv_cache import write_kv_cache_triton
        return write_kv_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)
