"""Fp8Linear (W8A8 dynamic) and the model-wide swap."""
import pytest
import torch
from torch import nn

from gdserve.kernels.quant import dequant_fp8_rowwise, quant_fp8_rowwise_reference
from gdserve.layers.quantization import Fp8Linear, quantize_linears


def linear(in_features: int, out_features: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias)


def test_output_is_the_product_of_the_dequantized_input_and_weight():
    dense = linear(64, 48)
    x = torch.randn(5, 3, 64) * torch.logspace(-2, 2, 5)[:, None, None]
    expected_w = dequant_fp8_rowwise(*quant_fp8_rowwise_reference(dense.weight.detach()), torch.float32)
    expected_x = dequant_fp8_rowwise(*quant_fp8_rowwise_reference(x.reshape(-1, 64)), torch.float32)
    expected = (expected_x @ expected_w.t() + dense.bias).view(5, 3, 48)
    out = Fp8Linear(dense)(x)
    assert out.shape == (5, 3, 48) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert Fp8Linear(dense).weight.dtype == torch.float8_e4m3fn


def test_close_to_the_dense_layer_in_bfloat16():
    dense = linear(256, 128, bias=False).to(torch.bfloat16)
    x = torch.randn(16, 256, dtype=torch.bfloat16)
    out, expected = Fp8Linear(dense)(x), dense(x)
    assert out.dtype == torch.bfloat16
    # two operands rounded to 3 mantissa bits: a few percent of the output's scale
    assert ((out - expected).float().norm() / expected.float().norm()) < 0.05


def test_quantize_linears_swaps_all_but_the_skipped():
    model = nn.Sequential(linear(32, 64), nn.ReLU(), nn.Sequential(linear(64, 32)), linear(32, 16))
    head = model[3]
    quantize_linears(model, "fp8", skip=(head,))
    assert isinstance(model[0], Fp8Linear) and isinstance(model[2][0], Fp8Linear)
    assert model[3] is head


def test_a_layer_the_fp8_gemm_cannot_take_is_named_and_nothing_is_swapped():
    model = nn.Sequential(linear(32, 64), linear(64, 40))
    with pytest.raises(ValueError, match=r"multiples of 16; 1 is 40 x 64"):
        quantize_linears(model, "fp8")
    assert all(isinstance(m, nn.Linear) for m in model)


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="quantization 'int4': expected one of fp8"):
        quantize_linears(nn.Sequential(linear(32, 32)), "int4")


def test_a_norm_and_an_activation_hand_an_fp8_linear_their_output_quantized():
    from gdserve.layers.activation import SiluAndMul
    from gdserve.layers.norm import RMSNorm
    from gdserve.layers.quantization import Fp8Activation
    norm, act, layer = RMSNorm(64), SiluAndMul(), Fp8Linear(linear(64, 48))
    norm.weight.data.normal_()
    x, residual, gate_up = torch.randn(5, 64), torch.randn(5, 64), torch.randn(5, 128)
    plain, plain_residual = norm(x, residual.clone())
    plain_act = act(gate_up)
    norm.quant_fp8 = act.quant_fp8 = True
    fused, fused_residual = norm(x, residual.clone())
    assert isinstance(fused, Fp8Activation) and fused.q.dtype == torch.float8_e4m3fn
    torch.testing.assert_close(fused_residual, plain_residual)
    torch.testing.assert_close(layer(fused), layer(plain), atol=0, rtol=0)
    assert isinstance(norm(x), Fp8Activation)
    fused_act = act(gate_up)
    assert isinstance(fused_act, Fp8Activation)
    torch.testing.assert_close(Fp8Linear(linear(64, 32))(fused_act), Fp8Linear(linear(64, 32))(plain_act),
                               atol=0, rtol=0)
