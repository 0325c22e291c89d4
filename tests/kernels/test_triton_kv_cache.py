import pytest
import torch

from gdserve.kernels.kv_cache import write_kv_cache
from tests.kernels.triton_cases import DEVICE, ON_CUDA, randn, requires_triton

pytestmark = requires_triton


@pytest.mark.parametrize("num_kv_heads,head_dim", [(8, 128), (1, 64), (3, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tokens_land_at_their_slots(num_kv_heads, head_dim, dtype):
    from gdserve.kernels.triton.kv_cache import write_kv_cache_triton
    num_blocks, block_size, tokens = (512, 16, 1000) if ON_CUDA else (6, 4, 9)
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(0))[:tokens]
    slots[1] = -1  # a padded token: skipped
    slots = slots.to(DEVICE)
    # Strided key/value, as the model passes them (views into the qkv projection).
    kv = randn(tokens, 2 * num_kv_heads + 1, head_dim, dtype=dtype)
    key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads:2 * num_kv_heads]
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, seed=1)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, seed=2)
    expected_k, expected_v = k_cache.cpu(), v_cache.cpu()  # copies on CUDA, the same tensors on the CPU
    if not ON_CUDA:
        expected_k, expected_v = expected_k.clone(), expected_v.clone()
    keep = (slots >= 0).cpu()
    write_kv_cache(key.cpu()[keep], value.cpu()[keep], expected_k, expected_v, slots.cpu()[keep])  # the reference
    write_kv_cache_triton(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache.cpu(), expected_k) and torch.equal(v_cache.cpu(), expected_v)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_rounds_and_saturates(cache_dtype, dtype):
    """Values round to the nearest fp8 (ties may round either way: the interpreter rounds them up)
    and those past the format's range saturate rather than turn into NaN."""
    from gdserve.kernels.triton.kv_cache import write_kv_cache_triton
    num_kv_heads, head_dim, tokens = 2, 64, 7
    limit = torch.finfo(cache_dtype).max
    kv = randn(tokens, 2 * num_kv_heads, head_dim, dtype=dtype, scale=30.0)
    kv[0, 0, :4] = torch.tensor([1e30, -1e30, limit * 1.01, -limit])  # past the range, and at it
    key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads:]
    k_cache = torch.zeros(4, 4, num_kv_heads, head_dim, dtype=cache_dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([13, 2, 7, 0, 15, 4, 9], device=DEVICE)
    write_kv_cache_triton(key, value, k_cache, v_cache, slots)
    expected_k, expected_v = torch.zeros_like(k_cache.cpu()), torch.zeros_like(v_cache.cpu())
    write_kv_cache(key.cpu(), value.cpu(), expected_k, expected_v, slots.cpu())  # the reference
    ulp = torch.finfo(cache_dtype).eps  # relative spacing of the format's normal values
    for got, expected in ((k_cache, expected_k), (v_cache, expected_v)):
        torch.testing.assert_close(got.float().cpu(), expected.float(), rtol=ulp, atol=0)
    assert not k_cache.float().isnan().any()
    assert k_cache[3, 1, 0, :4].float().tolist() == [limit, -limit, limit, -limit]


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
def test_public_op_dispatches_on_cuda():
    k_cache = torch.zeros(4, 4, 2, 64, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    key, value = randn(3, 2, 64), randn(3, 2, 64, seed=1)
    write_kv_cache(key, value, k_cache, v_cache, torch.tensor([13, 2, 7], device=DEVICE))
    assert torch.equal(k_cache[3, 1], key[0]) and torch.equal(v_cache[0, 2], value[1])
