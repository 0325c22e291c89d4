import pytest
import torch

from gdserve.kernels.fp8_gemm import fp8_gemm, fp8_gemm_reference
from gdserve.kernels.quant import quant_fp8_rowwise_reference
from gdserve.layers.quantization import Fp8Linear
from tests.kernels.triton_cases import DEVICE, ON_CUDA, randn, requires_triton

pytestmark = requires_triton
# (M, N, K): Llama-3-8B's qkv and down_proj on the device; ragged, uneven-K shapes here.
SHAPES = [(1, 6144, 4096), (77, 4096, 14336), (256, 28672, 4096)] if ON_CUDA else \
    [(1, 48, 64), (19, 80, 96), (40, 32, 200)]
CONFIGS = [(16, 32, 32, 1, 4, 2), (32, 16, 64, 2, 4, 3), (64, 64, 128, 3, 4, 2)]


def operands(m: int, n: int, k: int):
    a, a_scale = quant_fp8_rowwise_reference(randn(m, k, scale=3).float())
    w, w_scale = quant_fp8_rowwise_reference(randn(n, k, seed=1, scale=0.02).float())
    return a, a_scale, w, w_scale.t().contiguous()


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(m, n, k, config, out_dtype):
    from gdserve.kernels.triton.fp8_gemm import fp8_gemm_triton
    a, a_scale, w, w_scale = operands(m, n, k)
    out = fp8_gemm_triton(a, a_scale, w, w_scale, out_dtype, config)
    expected = fp8_gemm_reference(a, a_scale, w, w_scale, torch.float32)
    assert out.dtype == out_dtype and out.shape == (m, n)
    assert_close_to(out, expected)


def assert_close_to(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Sums in another order, partly in the tensor cores' narrower accumulator (a float32 add every
    128 products, as CUTLASS does); a bf16 output is rounded once more."""
    size = expected.abs().max().item()
    tol = dict(atol=2e-4 * size, rtol=1e-3) if out.dtype == torch.float32 else dict(atol=2 ** -9 * size, rtol=2 ** -7)
    torch.testing.assert_close(out.float(), expected, **tol)


def test_no_rows():
    from gdserve.kernels.triton.fp8_gemm import fp8_gemm_triton
    a, a_scale, w, w_scale = operands(3, 32, 64)
    assert fp8_gemm_triton(a[:0], a_scale[:0], w, w_scale, torch.bfloat16).shape == (0, 32)


@pytest.mark.skipif(not ON_CUDA, reason="the public op and torch._scaled_mm need CUDA tensors here")
@pytest.mark.parametrize("rows", [1, 64, 256, 257, 2048])
@pytest.mark.parametrize("in_features,out_features", [(4096, 6144), (14336, 4096)])
def test_fp8_linear_matches_the_dequantized_product(rows, in_features, out_features):
    """Both GEMM paths (Triton up to TRITON_MAX_ROWS rows, torch._scaled_mm above) at real shapes."""
    torch.manual_seed(0)
    dense = torch.nn.Linear(in_features, out_features, bias=False, device=DEVICE, dtype=torch.bfloat16)
    layer = Fp8Linear(dense)
    x = randn(rows, in_features, dtype=torch.bfloat16, scale=2)
    a, a_scale = quant_fp8_rowwise_reference(x)
    expected = fp8_gemm_reference(a, a_scale, layer.weight, layer.weight_scale, torch.float32)
    assert_close_to(layer(x), expected)
    assert_close_to(fp8_gemm(a, a_scale, layer.weight, layer.weight_scale, torch.bfloat16), expected)


@pytest.mark.parametrize("m,n,k", [(1, 6144, 4096), (100, 4096, 14336), (128, 28672, 4096), (7, 80, 96)])
def test_default_tiles_fit_the_shape(m, n, k):
    from gdserve.kernels.triton.fp8_gemm_configs import config_for
    block_m, block_n, block_k, split_k, warps, stages = config_for(m, n, k, torch.device(DEVICE))
    assert 16 <= block_m <= 128 and block_m & (block_m - 1) == 0 and split_k >= 1
    if m <= 64:
        assert block_m >= m  # one tile of rows: the weight is read once


@pytest.mark.skipif(not ON_CUDA, reason="the dispatch between Triton and torch._scaled_mm is CUDA's")
def test_a_float32_layer_keeps_float32_sums_at_any_row_count():
    torch.manual_seed(0)
    layer = Fp8Linear(torch.nn.Linear(4096, 6144, bias=False, device=DEVICE))
    x = randn(2048, 4096, scale=2)
    a, a_scale = quant_fp8_rowwise_reference(x)
    out = layer(x)
    assert out.dtype == torch.float32
    assert_close_to(out, fp8_gemm_reference(a, a_scale, layer.weight, layer.weight_scale, torch.float32))
