import pytest
import torch

from gdserve.kernels import native
from gdserve.kernels.rms_norm import rms_norm, rms_norm_reference

needs_native = pytest.mark.skipif(native.library() is None, reason="no C compiler for the native CPU kernels")


@needs_native
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (37, 576), (5, 100)])
def test_native_matches_reference(dtype, tol, rows, hidden):
    g = torch.Generator().manual_seed(rows + hidden)
    x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype)
    residual = torch.randn(rows, hidden, generator=g).to(dtype)
    weight = torch.rand(hidden, generator=g).to(dtype)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5), atol=tol, rtol=tol)
    expected_out, expected_res = rms_norm_reference(x, weight, 1e-5, residual.clone())
    out, res = rms_norm(x, weight, 1e-5, residual)
    torch.testing.assert_close(res, expected_res, atol=0, rtol=0)  # the sum, rounded once
    assert res.data_ptr() == residual.data_ptr()                   # updated in place
    torch.testing.assert_close(out, expected_out, atol=tol, rtol=tol)


def test_other_dtypes_and_layouts_take_the_reference():
    x = torch.randn(4, 16, dtype=torch.float64)
    torch.testing.assert_close(rms_norm(x, torch.ones(16, dtype=torch.float64), 1e-6),
                               rms_norm_reference(x, torch.ones(16, dtype=torch.float64), 1e-6))
    strided = torch.randn(16, 4).t()
    torch.testing.assert_close(rms_norm(strided, torch.ones(16), 1e-6), rms_norm_reference(strided, torch.ones(16), 1e-6))
