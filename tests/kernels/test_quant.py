"""The fp8 row-wise quantization reference: the scale, the rounding, and the error bound."""
import torch

from gdserve.kernels.fp8 import FP8_MAX, MIN_SCALE
from gdserve.kernels.quant import dequant_fp8_rowwise, quant_fp8_rowwise, quant_fp8_rowwise_reference


def test_each_rows_largest_magnitude_maps_to_the_fp8_max():
    x = torch.tensor([[1.0, -2.0, 0.5], [300.0, 10.0, -1.0]])
    q, scale = quant_fp8_rowwise_reference(x)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    torch.testing.assert_close(scale, torch.tensor([[2.0], [300.0]]) / FP8_MAX)
    assert q.float()[0, 1] == -FP8_MAX and q.float()[1, 0] == FP8_MAX


def test_ties_round_to_nearest_even():
    # scale 1: 17 lies halfway between 16 and 18 (spacing 2 above 16), 19 between 18 and 20.
    q, scale = quant_fp8_rowwise_reference(torch.tensor([[448.0, 17.0, 19.0, -17.0]]))
    assert scale.item() == 1.0
    assert q.float().tolist() == [[448.0, 16.0, 20.0, -16.0]]


def test_dequantized_error_is_within_half_an_fp8_step():
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 64)[:, None]
    q, scale = quant_fp8_rowwise_reference(x)
    error = (dequant_fp8_rowwise(q, scale, torch.float32) - x).abs()
    # e4m3 keeps 3 mantissa bits (relative step 2^-3); its smallest subnormal is 2^-9.
    bound = torch.maximum(x.abs() * 2.0 ** -4, scale * 2.0 ** -10)
    assert (error <= bound * (1 + 1e-6)).all()


def test_a_zero_row_keeps_a_positive_scale():
    q, scale = quant_fp8_rowwise_reference(torch.zeros(2, 32, dtype=torch.bfloat16))
    assert (scale == MIN_SCALE).all() and (q.float() == 0).all()


def test_bfloat16_rows_and_no_rows():
    x = torch.randn(3, 48).to(torch.bfloat16)
    q, scale = quant_fp8_rowwise(x)
    torch.testing.assert_close(dequant_fp8_rowwise(q, scale, torch.bfloat16), x, atol=0, rtol=2.0 ** -4)
    q, scale = quant_fp8_rowwise(torch.empty(0, 48))
    assert q.shape == (0, 48) and scale.shape == (0, 1)
