import pytest
import torch

from gdserve.kernels.activation import silu_and_mul, silu_and_mul_reference
from gdserve.kernels.quant import quant_fp8_rowwise_reference
from tests.kernels.triton_cases import ON_CUDA, assert_same_fp8_rows, bf16_tol, randn, requires_triton

pytestmark = requires_triton
SHAPES = [(1, 14336), (257, 14336), (33, 1536)] if ON_CUDA else [(1, 64), (5, 1500), (3, 1536)]


@pytest.mark.parametrize("rows,inter", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(rows, inter, dtype):
    from gdserve.kernels.triton.activation import silu_and_mul_triton
    x = randn(rows, 2 * inter, dtype=dtype, scale=4)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else bf16_tol()
    out = silu_and_mul_triton(x)
    assert out.shape == (rows, inter)
    torch.testing.assert_close(out, silu_and_mul_reference(x), **tol)


@pytest.mark.parametrize("rows,inter", SHAPES + [(2, 5000), (2, 20000)])  # one pass; two, past ONE_PASS_MAX
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_output_is_the_quantized_product(rows, inter, dtype):
    from gdserve.kernels.triton.activation import silu_and_mul_quant_fp8_triton
    x = randn(rows, 2 * inter, dtype=dtype, scale=4)
    expected = quant_fp8_rowwise_reference(silu_and_mul_reference(x))
    assert_same_fp8_rows(silu_and_mul_quant_fp8_triton(x), expected)
    q, scale = silu_and_mul_quant_fp8_triton(x[:0])
    assert q.shape == (0, inter) and scale.shape == (0, 1)


def test_empty_batch():
    from gdserve.kernels.triton.activation import silu_and_mul_triton
    assert silu_and_mul_triton(randn(0, 128)).shape == (0, 64)


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
def test_public_op_dispatches_on_cuda():
    from gdserve.kernels.triton.activation import silu_and_mul_triton
    x = randn(7, 512, dtype=torch.bfloat16)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_triton(x), atol=0, rtol=0)
