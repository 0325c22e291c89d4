"""KV-cache write: each new token's K and V go to its slot (block * block_size + offset)."""
import torch
import triton
import triton.language as tl

from gdserve.kernels.fp8 import is_fp8


@triton.jit
def _write_kv_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
                     SATURATE: tl.constexpr, LIMIT: tl.constexpr):
    """SATURATE: clamp to +-LIMIT, the cache format's largest finite value, before the cast (fp8:
    a plain cast would give NaN or inf past it)."""
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # a padded row (-1): nothing to store
        return
    n = tl.arange(0, BLOCK)
    mask = n < NUM_KV_HEADS * HEAD_DIM
    head, d = n // HEAD_DIM, n % HEAD_DIM
    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + d, mask=mask)
    if SATURATE:
        k = tl.clamp(k.to(tl.float32), -LIMIT, LIMIT)
        v = tl.clamp(v.to(tl.float32), -LIMIT, LIMIT)
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + n
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache_triton(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """key/value: [T, KVH, D] (any token/head strides, D contiguous); caches contiguous
    [num_blocks, block_size, KVH, D]; slot_mapping: [T], -1 skips a token."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert key.stride(2) == 1 and value.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, key.stride(0), key.stride(1), value.stride(0),
        value.stride(1), NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK=triton.next_power_of_2(num_kv_heads * head_dim),
        SATURATE=is_fp8(k_cache.dtype), LIMIT=torch.finfo(k_cache.dtype).max)
