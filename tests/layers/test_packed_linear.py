"""PackedLinear: shards along N, widening, perm, and the model-wide swap."""
import pytest
import torch
from torch import nn

from gdserve.kernels.packed_gemm import to_mma
from gdserve.layers.packed_linear import PackedLinear, pack_linears
from gdserve.quant.rtn import rtn_quantize


def assert_close_to(out: torch.Tensor, expected: torch.Tensor) -> None:
    """The CPU's native kernel sums in another order than torch's matmul: float32 rounding of
    the largest terms, not of each (possibly cancelled) output."""
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_shards_load_into_their_columns_and_the_forward_adds_the_bias():
    layer = PackedLinear(64, [32, 16], bits=4, group_size=32, bias=True)
    first, second = rtn_quantize(torch.randn(64, 32), 4, 32), rtn_quantize(torch.randn(64, 16), 4, 32)
    layer.load_shard(0, first)
    layer.load_shard(1, second)
    layer.bias.data.normal_()
    x = torch.randn(2, 3, 64)
    expected = x @ torch.cat([first.dequantize(), second.dequantize()], dim=1) + layer.bias
    assert_close_to(layer(x), expected)
    assert layer.num_bytes() == (64 // 8 * 48) * 4 + 2 * (2 * 48) * 4


def test_a_4_bit_shard_of_an_8_bit_layer_widens_exactly():
    layer = PackedLinear(64, [16, 16], bits=8, group_size=32, bias=False)
    narrow, wide = rtn_quantize(torch.randn(64, 16), 4, 32), rtn_quantize(torch.randn(64, 16), 8, 32)
    layer.load_shard(0, narrow)
    layer.load_shard(1, wide)
    assert torch.equal(layer.packed.dequantize(), torch.cat([narrow.dequantize(), wide.dequantize()], dim=1))


def test_mismatched_shards_are_named():
    layer = PackedLinear(64, [16, 16], bits=4, group_size=32, bias=False)
    with pytest.raises(ValueError, match=r"shard 1 of \[16, 16\]: 4-bit, group 64; the layer is 4-bit, group 32"):
        layer.load_shard(1, rtn_quantize(torch.randn(64, 16), 4, 64))
    with pytest.raises(ValueError, match=r"a weight of 64 x 8 \(in x out\), expected 64 x 16"):
        layer.load_shard(0, rtn_quantize(torch.randn(64, 8), 4, 32))
    layer.load_shard(0, rtn_quantize(torch.randn(64, 16), 4, 32), perm=torch.randperm(64))
    with pytest.raises(ValueError, match="orders the input rows differently"):
        layer.load_shard(1, rtn_quantize(torch.randn(64, 16), 4, 32), perm=torch.randperm(64))


def test_finish_loading_keeps_the_rows_layout_on_the_cpu_and_closes_the_layer():
    layer = PackedLinear(128, [16], bits=4, group_size=64, bias=False)
    weight = rtn_quantize(torch.randn(128, 16), 4, 64)
    layer.load_shard(0, weight)
    layer.finish_loading()
    assert layer.layout == "rows" and torch.equal(layer.packed.dequantize(), weight.dequantize())


def test_a_layer_in_the_mma_layout_computes_the_same_and_takes_no_more_shards():
    layer = PackedLinear(128, [16], bits=4, group_size=64, bias=True)
    weight = rtn_quantize(torch.randn(128, 16), 4, 64)
    layer.load_shard(0, weight)
    layer.bias.data.normal_()
    x = torch.randn(3, 128)
    expected = layer(x)
    layer.qweight, layer.layout = to_mma(layer.packed).qweight, "mma"  # as finish_loading does on CUDA
    torch.testing.assert_close(layer(x), expected)
    assert "layout=mma" in repr(layer)
    with pytest.raises(ValueError, match="already repacked for the device"):
        layer.load_shard(0, weight)


def test_perm_reorders_the_input_columns():
    layer = PackedLinear(64, [16], bits=4, group_size=32, bias=False)
    weight, perm = rtn_quantize(torch.randn(64, 16), 4, 32), torch.randperm(64)
    layer.load_shard(0, weight, perm)
    x = torch.randn(5, 64)
    assert_close_to(layer(x), x[:, perm] @ weight.dequantize())


def test_pack_linears_swaps_all_but_the_skipped_or_names_the_layer_it_cannot_pack():
    model = nn.Sequential(nn.Linear(64, 32), nn.Sequential(nn.Linear(32, 64)), nn.Linear(64, 10))
    head = model[2]
    assert pack_linears(model, lambda name: (4, -1), skip=(head,)) == ["0", "1.0"]
    assert isinstance(model[0], PackedLinear) and model[0].group_size == 64 and model[1][0].group_size == 32
    assert model[2] is head
    bad = nn.Sequential(nn.Linear(64, 32), nn.Linear(48, 8))
    with pytest.raises(ValueError, match="1: group_size 32 does not divide in_features 48"):
        pack_linears(bad, lambda name: (4, 32))
    assert all(isinstance(m, nn.Linear) for m in bad)
    with pytest.raises(ValueError, match="3-bit weights are not supported"):
        pack_linears(bad, lambda name: (3, 16))
