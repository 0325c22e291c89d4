import pytest
import torch

from gdserve.kernels.rms_norm import rms_norm, rms_norm_reference
from gdserve.kernels.quant import quant_fp8_rowwise_reference
from tests.kernels.triton_cases import ON_CUDA, assert_same_fp8_rows, bf16_tol, randn, requires_triton

pytestmark = requires_triton
SHAPES = [(1, 4096), (257, 4096), (33, 5120)] if ON_CUDA else [(1, 64), (5, 100), (3, 576)]


@pytest.mark.parametrize("rows,hidden", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(rows, hidden, dtype):
    from gdserve.kernels.triton.rms_norm import rms_norm_triton
    x, residual = randn(rows, hidden, dtype=dtype, scale=3), randn(rows, hidden, dtype=dtype, seed=1)
    weight = randn(hidden, dtype=dtype, seed=2)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else bf16_tol()
    torch.testing.assert_close(rms_norm_triton(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5), **tol)
    expected_out, expected_sum = rms_norm_reference(x, weight, 1e-5, residual.clone())
    out, new_residual = rms_norm_triton(x, weight, 1e-5, residual)
    assert new_residual.data_ptr() == residual.data_ptr()  # updated in place
    torch.testing.assert_close(new_residual, expected_sum, **tol)
    torch.testing.assert_close(out, expected_out, **tol)


@pytest.mark.parametrize("rows,hidden", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_output_is_the_quantized_norm(rows, hidden, dtype):
    from gdserve.kernels.triton.rms_norm import rms_norm_triton
    x, residual = randn(rows, hidden, dtype=dtype, scale=3), randn(rows, hidden, dtype=dtype, seed=1)
    weight = randn(hidden, dtype=dtype, seed=2)
    expected = quant_fp8_rowwise_reference(rms_norm_reference(x, weight, 1e-5))
    assert_same_fp8_rows(rms_norm_triton(x, weight, 1e-5, quant_fp8=True), expected)
    expected_out, expected_sum = rms_norm_reference(x, weight, 1e-5, residual.clone())
    out, new_residual = rms_norm_triton(x, weight, 1e-5, residual, quant_fp8=True)
    torch.testing.assert_close(new_residual, expected_sum, **(bf16_tol() if dtype == torch.bfloat16 else {}))
    assert_same_fp8_rows(out, quant_fp8_rowwise_reference(expected_out))


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
def test_public_op_dispatches_on_cuda():
    x, w = randn(7, 256, dtype=torch.bfloat16), randn(256, dtype=torch.bfloat16, seed=1)
    from gdserve.kernels.triton.rms_norm import rms_norm_triton
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_triton(x, w, 1e-6), atol=0, rtol=0)
