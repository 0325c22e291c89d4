import pytest
import torch

from gdserve.kernels import native
from gdserve.kernels.activation import silu_and_mul, silu_and_mul_reference


@pytest.mark.skipif(native.library() is None, reason="no C compiler for the native CPU kernels")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_native_matches_reference(dtype, tol):
    x = (torch.randn(13, 2 * 1536, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    out = silu_and_mul(x)
    assert out.shape == (13, 1536)
    torch.testing.assert_close(out, silu_and_mul_reference(x), atol=tol, rtol=tol)


def test_non_contiguous_input_takes_the_reference():
    x = torch.randn(8, 6).t()  # [6, 8]
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_reference(x))
