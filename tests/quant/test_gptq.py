"""GPTQ's layout: q packed along K, zeros along N (with the original format's offset of 1), and
desc_act's scattered groups."""
import pytest
import torch

from gdserve.kernels.packed_gemm import unpack
from gdserve.quant.gptq import gptq_to_packed
from tests.quant.checkpoints import pack_plain


def test_rows_pack_eight_to_a_word_low_bits_first():
    q = torch.arange(8).view(8, 1) % 16                      # rows 0..7 of one column
    assert pack_plain(q, 4, 0).item() == 0x76543210
    assert torch.equal(unpack(pack_plain(q, 4, 0), 4).long(), q)


@pytest.mark.parametrize("zero_offset", [0, 1])
def test_zero_points_and_the_original_formats_offset(zero_offset):
    q = torch.randint(0, 16, (64, 8))
    zeros = torch.randint(1, 16, (2, 8))
    scales = torch.rand(2, 8).half()
    projection = gptq_to_packed(pack_plain(q, 4, 0), pack_plain(zeros - zero_offset, 4, 1), scales, None,
                                4, 32, zero_offset, torch.float32)
    expected = (q - zeros.repeat_interleave(32, 0)) * scales.float().repeat_interleave(32, 0)
    assert projection.perm is None
    assert torch.equal(projection.weight.dequantize(), expected)


def test_desc_act_rows_are_sorted_by_group_and_the_input_follows():
    k, n, g = 64, 8, 16
    g_idx = torch.randperm(k) % (k // g)
    q = torch.randint(0, 16, (k, n))
    zeros, scales = torch.randint(0, 16, (k // g, n)), torch.rand(k // g, n).half()
    projection = gptq_to_packed(pack_plain(q, 4, 0), pack_plain(zeros, 4, 1), scales, g_idx.int(), 4, g, 0,
                                torch.float32)
    dense = (q - zeros[g_idx]) * scales.float()[g_idx]
    x = torch.randn(3, k)
    assert projection.perm is not None
    assert torch.equal(projection.weight.dequantize(), dense[projection.perm])
    torch.testing.assert_close(x[:, projection.perm] @ projection.weight.dequantize(), x @ dense)


def test_a_g_idx_with_unequal_groups_is_refused():
    g_idx = torch.zeros(64, dtype=torch.int32)
    g_idx[:8] = 1
    with pytest.raises(ValueError, match="g_idx does not put 32 of the 64 input rows in each group"):
        gptq_to_packed(torch.zeros(8, 8, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32),
                       torch.ones(2, 8).half(), g_idx, 4, 32, 0, torch.float32)
