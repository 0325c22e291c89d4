import pytest
import torch

from gdserve.quant.rtn import rtn_quantize


def test_round_to_nearest_is_within_half_a_step_of_each_group():
    weight = torch.randn(256, 48)
    packed = rtn_quantize(weight, bits=4, group_size=128)
    assert (packed.bits, packed.group_size, packed.scales.shape) == (4, 128, (2, 48))
    step = packed.scales.repeat_interleave(128, 0)
    assert ((packed.dequantize() - weight).abs() <= step / 2 + 1e-6).all()


def test_a_group_size_that_does_not_divide_is_named():
    with pytest.raises(ValueError, match="group_size 128 does not divide in_features 576"):
        rtn_quantize(torch.randn(576, 8), group_size=128)
