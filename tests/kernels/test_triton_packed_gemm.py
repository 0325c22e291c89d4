import pytest
import torch

from gdserve.kernels.packed_gemm import PackedWeight, pack, packed_gemm, packed_gemm_reference
from tests.kernels.triton_cases import DEVICE, ON_CUDA, randn, requires_triton

pytestmark = requires_triton
# (M, N, K): Llama-3-8B's qkv, gate_up and down_proj on the device; ragged, uneven-K shapes here.
SHAPES = [(1, 6144, 4096), (16, 28672, 4096), (77, 4096, 14336)] if ON_CUDA else \
    [(1, 48, 256), (19, 80, 256), (5, 32, 384)]
# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages), the tiled kernel (4-bit needs
# BLOCK_K >= 128, 8-bit >= 64); (BLOCK_N, BLOCK_K, SPLIT_K, num_warps), the row-a-program one
CONFIGS = [(16, 32, 128, 1, 4, 2), (16, 64, 128, 2, 4, 3), (32, 16, 256, 3, 4, 2), (32, 64, 1, 4), (64, 32, 3, 4),
           (16, 256, 2, 4)]
# The interpreter's tl.dot multiplies bfloat16 as raw uint16 bits: float16 there, bfloat16 on CUDA.
HALF = torch.bfloat16 if ON_CUDA else torch.float16
FORMATS = [(4, 128), (4, 32), (8, 64), (8, 128)]  # (bits, group_size): one group a tile, or several


def packed_weight(k: int, n: int, bits: int, group_size: int, dtype: torch.dtype, seed: int = 1) -> PackedWeight:
    """Random codes, positive scales ~0.01 and biases of either sign (an AWQ-like zero point ~ half the range)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (k, n), generator=g, dtype=torch.int32)
    scales = torch.rand(k // group_size, n, generator=g) * 0.02 + 0.002
    biases = -scales * torch.randint(0, 1 << bits, (k // group_size, n), generator=g)
    return PackedWeight(pack(q, bits).to(DEVICE), scales.to(dtype).to(DEVICE), biases.to(dtype).to(DEVICE),
                        bits, group_size)


def assert_close_to(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Sums in another order; where one group spans a whole tile the kernel multiplies by the
    exact codes and applies the scales after (the reference rounds each dequantized weight to
    the activation dtype), so bf16 runs differ by a few bf16 ulps of the largest output."""
    size = expected.float().abs().max().item()
    tol = dict(atol=1e-5 * size, rtol=1e-4) if out.dtype == torch.float32 else dict(atol=2 ** -6 * size, rtol=2 ** -6)
    torch.testing.assert_close(out.float(), expected.float(), **tol)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("bits,group_size", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_matches_reference(m, n, k, config, bits, group_size, dtype):
    from gdserve.kernels.triton.packed_gemm import packed_gemm_triton
    w = packed_weight(k, n, bits, group_size, dtype)
    x = randn(m, k, dtype=dtype)
    out = packed_gemm_triton(x, w.qweight, w.scales, w.biases, bits, group_size, config)
    assert out.dtype == dtype and out.shape == (m, n)
    assert_close_to(out, packed_gemm_reference(x, w))


@pytest.mark.parametrize("bits,group_size", [(4, 128), (8, 32)])
def test_dequantize_matches_the_reference(bits, group_size):
    from gdserve.kernels.triton.packed_gemm import dequantize_triton
    w = packed_weight(256, 48, bits, group_size, HALF)
    out = dequantize_triton(w.qweight, w.scales, w.biases, bits, group_size)
    torch.testing.assert_close(out, w.dequantize(), atol=0, rtol=2 ** -10)  # an FMA rounds once, torch twice


@pytest.mark.parametrize("m", [1, 2, 7, 300] if ON_CUDA else [1, 2, 7])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16] if ON_CUDA else [torch.float16])
def test_default_path_matches_reference(m, dtype):
    """packed_gemm's own dispatch: a program a row for the fewest, the tuned or default tiles, and
    cuBLAS from DEQUANT_MIN_ROWS rows."""
    n, k = (4096, 14336) if ON_CUDA else (64, 256)
    w = packed_weight(k, n, 4, 128, dtype)
    x = randn(m, k, dtype=dtype)
    if ON_CUDA:
        out = packed_gemm(x, w)
    else:  # the public op keeps CPU tensors on the CPU path; the wrapper runs the interpreter
        from gdserve.kernels.triton.packed_gemm import packed_gemm_triton
        out = packed_gemm_triton(x, w.qweight, w.scales, w.biases, 4, 128)
    assert_close_to(out, packed_gemm_reference(x, w))


def test_no_rows():
    from gdserve.kernels.triton.packed_gemm import packed_gemm_triton
    w = packed_weight(128, 32, 4, 128, HALF)
    x = randn(0, 128, dtype=HALF)
    assert packed_gemm_triton(x, w.qweight, w.scales, w.biases, 4, 128).shape == (0, 32)


@pytest.mark.parametrize("m,n,k", [(1, 6144, 4096), (16, 4096, 14336), (64, 28672, 4096), (7, 80, 96)])
@pytest.mark.parametrize("bits,group_size", [(4, 128), (4, 32), (8, 32), (4, 4096)])
def test_default_tiles_fit_the_shape(m, n, k, bits, group_size):
    from gdserve.kernels.triton.packed_gemm_configs import config_for, min_block_k
    block_m, block_n, block_k, split_k, warps, stages = config_for(m, n, k, bits, group_size, torch.device(DEVICE))
    assert 16 <= block_m <= 128 and block_m & (block_m - 1) == 0 and split_k >= 1
    assert block_k >= min_block_k(bits) and block_k & (block_k - 1) == 0
    if m <= 64:
        assert block_m >= m  # one tile of rows: the weight is read once


@pytest.mark.parametrize("m,n,k", [(1, 6144, 4096), (2, 4096, 14336), (1, 80, 96)])
@pytest.mark.parametrize("bits,group_size", [(4, 128), (4, 32), (8, 32), (4, 4096)])
def test_default_row_kernel_tiles_fit_the_shape(m, n, k, bits, group_size):
    from gdserve.kernels.triton.packed_gemm_configs import gemv_config_for
    block_n, block_k, split_k, warps = gemv_config_for(m, n, k, bits, group_size, torch.device(DEVICE))
    assert block_k % (32 // bits) == 0 and block_k & (block_k - 1) == 0 and block_n & (block_n - 1) == 0
    assert split_k >= 1 and group_size % block_k == 0  # one group a tile where the group allows


# The mma layout's kernel: (BLOCK_M, BLOCK_N, SPLIT_K, num_warps, num_stages)
MMA_CONFIGS = [(16, 64, 1, 4, 2, True), (32, 64, 2, 4, 2, True), (64, 128, 1, 8, 3, False), (16, 64, 2, 4, 2, False),
               (64, 64, 1, 4, 2, True)]
# one group a tile (the codes multiplied as they are), a group a word or two (scaled before the
# dot), per channel, and a group size that fits neither (scales gathered a weight each)
MMA_FORMATS = [(128, 256), (32, 256), (64, 192), (-1, 384), (96, 288)] if not ON_CUDA else \
    [(128, 4096), (32, 4096), (64, 14336), (-1, 4096), (96, 4032)]


@pytest.mark.parametrize("m", [1, 5, 19] if not ON_CUDA else [1, 16, 77, 200])
@pytest.mark.parametrize("config", MMA_CONFIGS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("group_size,k", MMA_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])  # each its own code bits
def test_mma_kernel_matches_reference(m, config, group_size, k, dtype):
    from gdserve.kernels.packed_gemm import to_mma
    from gdserve.kernels.triton.packed_gemm_mma import packed_gemm_mma_triton
    n = 80 if not ON_CUDA else 6144
    group_size = k if group_size == -1 else group_size
    w = to_mma(packed_weight(k, n, 4, group_size, dtype))
    x = randn(m, k, dtype=dtype)
    out = packed_gemm_mma_triton(x, w.qweight, w.scales, w.biases, group_size, config)
    assert out.dtype == dtype and out.shape == (m, n)
    assert_close_to(out, packed_gemm_reference(x, w))


@pytest.mark.parametrize("m", [1, 2, 7] if not ON_CUDA else [1, 2, 7, 64, 300, 1000])
def test_mma_default_path_matches_reference(m, monkeypatch):
    """packed_gemm's own dispatch for an mma weight: the fused kernel's default tiles, and the
    dequantize kernel with cuBLAS from MMA_DEQUANT_MIN_ROWS rows (lowered here to reach it)."""
    from gdserve.kernels.packed_gemm import to_mma
    from gdserve.kernels.triton import packed_gemm_configs
    from gdserve.kernels.triton.packed_gemm_mma import packed_gemm_mma_triton
    if not ON_CUDA:
        monkeypatch.setattr(packed_gemm_configs, "MMA_DEQUANT_MIN_ROWS", 7)
    n, k = (4096, 14336) if ON_CUDA else (64, 256)
    w = to_mma(packed_weight(k, n, 4, 128, HALF))
    x = randn(m, k, dtype=HALF)
    out = packed_gemm(x, w) if ON_CUDA else packed_gemm_mma_triton(x, w.qweight, w.scales, w.biases, 128)
    assert_close_to(out, packed_gemm_reference(x, w))


@pytest.mark.parametrize("group_size,k", [(128, 256), (32, 96), (576, 576)])
def test_mma_dequantize_matches_the_reference(group_size, k):
    from gdserve.kernels.packed_gemm import to_mma
    from gdserve.kernels.triton.packed_gemm_mma import dequantize_mma_triton
    w = to_mma(packed_weight(k, 48, 4, group_size, HALF))
    out = dequantize_mma_triton(w.qweight, w.scales, w.biases, group_size)
    torch.testing.assert_close(out, w.dequantize().t(), atol=0, rtol=2 ** -10)


def test_mma_kernel_takes_warpgroup_tiles_only():
    from gdserve.kernels.packed_gemm import to_mma
    from gdserve.kernels.triton.packed_gemm_mma import packed_gemm_mma_triton
    w = to_mma(packed_weight(128, 32, 4, 128, HALF))
    with pytest.raises(ValueError, match="BLOCK_N a multiple of 64, got 32"):
        packed_gemm_mma_triton(randn(3, 128, dtype=HALF), w.qweight, w.scales, w.biases, 128, (16, 32, 1, 4, 2, True))


def test_mma_no_rows():
    from gdserve.kernels.packed_gemm import to_mma
    from gdserve.kernels.triton.packed_gemm_mma import packed_gemm_mma_triton
    w = to_mma(packed_weight(128, 32, 4, 128, HALF))
    out = packed_gemm_mma_triton(randn(0, 128, dtype=HALF), w.qweight, w.scales, w.biases, 128, (16, 64, 2, 4, 2, True))
    assert out.shape == (0, 32)


@pytest.mark.parametrize("m", [1, 16, 64, 200, 511, 512])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 14336), (80, 96)])
def test_mma_default_tiles_fit_the_shape(m, n, k):
    from gdserve.kernels.triton.packed_gemm_configs import MMA_DEQUANT_MIN_ROWS, mma_config_for
    config = mma_config_for(m, n, k, 128, torch.device(DEVICE))
    if m >= MMA_DEQUANT_MIN_ROWS:
        assert config is None
        return
    block_m, block_n, split_k, warps, stages, factored = config
    assert factored == (block_m <= 32)
    assert 16 <= block_m <= 128 and block_m & (block_m - 1) == 0 and block_n in (64, 128)
    assert split_k >= 1 and warps in (4, 8) and stages >= 2
    if m <= 128:
        assert block_m >= m  # one tile of rows: the weight is read once
