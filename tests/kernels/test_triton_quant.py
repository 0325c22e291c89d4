import pytest
import torch

from gdserve.kernels.quant import quant_fp8_rowwise, quant_fp8_rowwise_reference
from tests.kernels.triton_cases import ON_CUDA, randn, requires_triton

pytestmark = requires_triton
SHAPES = [(1, 4096), (257, 4096), (33, 14336)] if ON_CUDA else [(1, 64), (5, 100), (3, 576)]


def assert_same(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert actual[0].dtype == expected[0].dtype == torch.float8_e4m3fn
    assert torch.equal(actual[0].view(torch.uint8), expected[0].view(torch.uint8))  # the same codes
    assert torch.equal(actual[1], expected[1])


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference_bit_for_bit(rows, cols, dtype):
    from gdserve.kernels.triton.quant import quant_fp8_rowwise_triton
    x = randn(rows, cols, dtype=dtype, scale=5)
    x[0, :7] = 0.0
    assert_same(quant_fp8_rowwise_triton(x), quant_fp8_rowwise_reference(x))


def test_strided_rows_zero_rows_and_ties():
    from gdserve.kernels.triton.quant import quant_fp8_rowwise_triton
    wide = randn(6, 160, scale=0.01)
    x = wide[:, 16:144]                        # rows 160 apart
    x[1] = 0.0
    x[2, :4] = torch.tensor([448.0, 17.0, 19.0, -17.0])
    assert_same(quant_fp8_rowwise_triton(x), quant_fp8_rowwise_reference(x))
    q, scale = quant_fp8_rowwise_triton(x[:0])
    assert q.shape == (0, 128) and scale.shape == (0, 1)


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
def test_public_op_dispatches_on_cuda():
    from gdserve.kernels.triton.quant import quant_fp8_rowwise_triton
    x = randn(7, 256, dtype=torch.bfloat16)
    assert_same(quant_fp8_rowwise(x), quant_fp8_rowwise_triton(x))
