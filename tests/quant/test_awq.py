"""AWQ's interleaved nibble order, against the layout written out here."""
import torch

from gdserve.quant.awq import AWQ_ORDER, awq_to_packed, unpack_awq


def test_the_nibble_order_is_autoawqs():
    # AutoAWQ's GEMM packer: for i in 0..7, word |= column [0, 2, 4, 6, 1, 3, 5, 7][i] << 4 * i
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    columns = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
    word = 0x75316420  # nibbles, low first: columns 0, 2, 4, 6, 1, 3, 5, 7
    assert torch.equal(unpack_awq(torch.tensor([[word]], dtype=torch.int32)), columns)
    high = torch.tensor([[15, 14, 13, 12, 11, 10, 9, 8]])
    # nibbles low first: 15, 13, 11, 9, 14, 12, 10, 8 -> 0x8ACE9BDF, negative as an int32
    assert torch.equal(unpack_awq(torch.tensor([[0x8ACE9BDF - (1 << 32)]], dtype=torch.int32)), high)


def test_a_weight_dequantizes_to_scale_times_q_minus_zero():
    from tests.quant.checkpoints import awq_pack
    q = torch.randint(0, 16, (128, 16))
    zeros = torch.randint(0, 16, (2, 16))
    scales = torch.rand(2, 16).half()
    packed = awq_to_packed(awq_pack(q), awq_pack(zeros), scales, 64, torch.float32)
    expected = (q - zeros.repeat_interleave(64, 0)) * scales.float().repeat_interleave(64, 0)
    assert (packed.bits, packed.group_size) == (4, 64)
    assert torch.equal(packed.dequantize(), expected)
