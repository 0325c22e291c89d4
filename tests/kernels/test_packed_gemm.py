import pytest
import torch

from gdserve.kernels import native
from gdserve.kernels.packed_gemm import (NATIVE_MAX_ROWS, PackedWeight, cuda_packed_layout, device_layout, pack, packed_gemm,
                                         packed_gemm_reference, to_mma, to_rows, unpack)


def codes(k: int, n: int, bits: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 1 << bits, (k, n), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


def packed_weight(k: int, n: int, bits: int, group_size: int, dtype: torch.dtype = torch.float32) -> PackedWeight:
    g = torch.Generator().manual_seed(1)
    scales = torch.rand(k // group_size, n, generator=g) * 0.02 + 0.002
    biases = -scales * torch.randint(0, 1 << bits, (k // group_size, n), generator=g)
    return PackedWeight(pack(codes(k, n, bits), bits), scales.to(dtype), biases.to(dtype), bits, group_size)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.int64])
def test_pack_round_trip(bits, dtype):
    q = codes(64, 24, bits).to(dtype)
    qweight = pack(q, bits)
    assert qweight.dtype == torch.int32 and qweight.shape == (64 * bits // 32, 24)
    assert torch.equal(unpack(qweight, bits).long(), q.long())


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_puts_low_bits_first(bits):
    """Element k of a column sits in word k // (32 // bits), at bit (k % (32 // bits)) * bits."""
    per_word = 32 // bits
    q = torch.zeros(2 * per_word, 1, dtype=torch.int32)
    q[1, 0] = 1  # second value of the first word
    q[per_word + per_word - 1, 0] = (1 << bits) - 1  # last value of the second word: the sign bit
    words = pack(q, bits)[:, 0].tolist()
    assert words[0] == 1 << bits
    assert words[1] & 0xFFFFFFFF == ((1 << bits) - 1) << (32 - bits)


def test_dequantize_applies_each_groups_scale_and_bias():
    q = codes(64, 3, 4)
    scales = torch.tensor([[1.0, 2.0, 0.5], [0.25, 1.0, 3.0]])
    biases = torch.tensor([[-8.0, 0.0, 1.0], [2.0, -1.0, 0.0]])
    w = PackedWeight(pack(q, 4), scales, biases, 4, 32)
    expected = q.float() * scales.repeat_interleave(32, 0) + biases.repeat_interleave(32, 0)
    assert torch.equal(w.dequantize(), expected)
    assert (w.in_features, w.out_features) == (64, 3)
    assert w.num_bytes() == 8 * 3 * 4 + 2 * 2 * 3 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_is_the_product_with_the_dequantized_weight(dtype):
    w = packed_weight(128, 40, 4, 64, dtype)
    x = torch.randn(5, 128).to(dtype)
    out = packed_gemm_reference(x, w)
    assert out.dtype == dtype and out.shape == (5, 40)
    torch.testing.assert_close(out, (x.float() @ w.dequantize().float()).to(dtype))


# (K, N, bits, group_size): SmolLM2's widths, per-channel groups, columns not a multiple of the
# native kernel's block, 8-bit words
SHAPES = [(576, 192, 4, 32), (576, 200, 4, 64), (512, 96, 4, 128), (256, 70, 4, 256), (576, 64, 8, 32),
          (1536, 72, 8, 128)]


def assert_close_to(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Sums in another order (the native kernel applies the scales per group, after the sums)."""
    size = expected.float().abs().max().item()
    tol = dict(atol=1e-5 * size, rtol=1e-4) if out.dtype == torch.float32 else dict(atol=2 ** -7 * size, rtol=2 ** -7)
    torch.testing.assert_close(out.float(), expected.float(), **tol)


@pytest.mark.parametrize("k,n,bits,group_size", SHAPES)
@pytest.mark.parametrize("m", [1, 3, NATIVE_MAX_ROWS, NATIVE_MAX_ROWS + 1, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_paths_match_reference(k, n, bits, group_size, m, dtype):
    w = packed_weight(k, n, bits, group_size, dtype)
    x = torch.randn(m, k).to(dtype)
    out = packed_gemm(x, w)
    assert out.dtype == dtype and out.shape == (m, n)
    assert_close_to(out, packed_gemm_reference(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_kernel_runs_for_few_rows(dtype, monkeypatch):
    """Few rows go to csrc/packed_gemm.c (where it builds): not to the dequantizing path."""
    if native.kernel("packed_gemm", torch.zeros(1, dtype=dtype)) is None:
        pytest.skip("no C compiler: the CPU keeps the torch path")
    from gdserve.kernels import packed_gemm as module

    def fail(*args):
        raise AssertionError("dequantized the weight for a decode-size call")

    w = packed_weight(576, 96, 4, 32, dtype)
    x = torch.randn(4, 576).to(dtype)
    expected = packed_gemm_reference(x, w)
    monkeypatch.setattr(module, "_dequantize_rows", fail)
    assert_close_to(packed_gemm(x, w), expected)


def test_blocked_path_sums_over_several_blocks(monkeypatch):
    """Many rows: blocks of K dequantized one at a time, float32 sums across them."""
    from gdserve.kernels import packed_gemm as module
    monkeypatch.setattr(module, "DEQUANT_BLOCK_ELEMENTS", 64 * 40)
    w = packed_weight(256, 40, 4, 32)
    x = torch.randn(NATIVE_MAX_ROWS + 5, 256)
    assert_close_to(packed_gemm(x, w), packed_gemm_reference(x, w))


def test_strided_input():
    w = packed_weight(128, 40, 4, 32)
    x = torch.randn(128, 6)[:, :3].t()  # [3, 128], not contiguous
    assert_close_to(packed_gemm(x, w), packed_gemm_reference(x, w))


def test_no_rows():
    w = packed_weight(128, 40, 4, 32)
    assert packed_gemm(torch.zeros(0, 128), w).shape == (0, 40)


def test_rejects_bits_other_than_4_and_8():
    q = codes(32, 4, 2)
    for bad in (2, 3, 16):
        with pytest.raises(ValueError, match="bits must be 4 or 8"):
            pack(q, bad)
        with pytest.raises(ValueError, match="bits must be 4 or 8"):
            unpack(torch.zeros(4, 4, dtype=torch.int32), bad)
        with pytest.raises(ValueError, match="bits must be 4 or 8"):
            PackedWeight(torch.zeros(4, 4, dtype=torch.int32), torch.ones(1, 4), torch.zeros(1, 4), bad, 32)


@pytest.mark.parametrize("bits,rows", [(4, 12), (8, 6)])
def test_pack_rejects_k_not_a_multiple_of_the_values_a_word(bits, rows):
    with pytest.raises(ValueError, match=f"not a multiple of {32 // bits}"):
        pack(codes(rows, 4, bits), bits)


def test_pack_rejects_out_of_range_codes():
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        pack(torch.full((8, 2), 16), 4)
    with pytest.raises(ValueError, match=r"\[0, 256\)"):
        pack(torch.full((8, 2), -1), 8)
    with pytest.raises(ValueError, match="integer"):
        pack(torch.zeros(8, 2), 4)


def test_rejects_a_group_size_that_does_not_divide_k():
    qweight = pack(codes(96, 4, 4), 4)
    with pytest.raises(ValueError, match="group_size 64 does not divide in_features 96"):
        PackedWeight(qweight, torch.ones(1, 4), torch.zeros(1, 4), 4, 64)


def test_rejects_scales_of_the_wrong_shape_or_dtype():
    qweight = pack(codes(64, 4, 4), 4)
    with pytest.raises(ValueError, match=r"scales must have shape \(2, 4\)"):
        PackedWeight(qweight, torch.ones(1, 4), torch.zeros(2, 4), 4, 32)
    with pytest.raises(ValueError, match="biases are torch.float16 but scales are torch.float32"):
        PackedWeight(qweight, torch.ones(2, 4), torch.zeros(2, 4, dtype=torch.float16), 4, 32)
    with pytest.raises(ValueError, match="qweight must be a 2-D int32"):
        PackedWeight(qweight.to(torch.int64), torch.ones(2, 4), torch.zeros(2, 4), 4, 32)


def test_gemm_rejects_mismatched_inputs():
    w = packed_weight(64, 8, 4, 32)
    with pytest.raises(ValueError, match="x is torch.bfloat16 but the weight's scales are torch.float32"):
        packed_gemm(torch.zeros(2, 64, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="x has 32 features but the weight has in_features 64"):
        packed_gemm(torch.zeros(2, 32), w)
    with pytest.raises(ValueError, match="2-D"):
        packed_gemm(torch.zeros(2, 2, 64), w)
    with pytest.raises(ValueError, match="x has 32 features"):
        packed_gemm_reference(torch.zeros(2, 32), w)


@pytest.mark.parametrize("k,n,group_size", [(256, 48, 128), (96, 8, 32), (576, 40, 576), (4096, 24, 64)])
def test_mma_layout_round_trip(k, n, group_size):
    """Any K (padded to whole 128-value tiles with zero codes); to_rows undoes to_mma exactly."""
    w = packed_weight(k, n, 4, group_size)
    mma = to_mma(w)
    assert mma.layout == "mma" and mma.qweight.shape == (n, -(-k // 128) * 16)
    assert (mma.in_features, mma.out_features) == (k, n)
    assert torch.equal(mma.codes(), w.codes())
    assert torch.equal(to_rows(mma).qweight, w.qweight)
    assert torch.equal(mma.dequantize(), w.dequantize())


def test_mma_layout_puts_a_threads_values_in_its_words():
    """Word (t, w) of a tile holds, in nibble 4 e + 2 c + a, the code of k = 32 w + 16 e + 8 c + 2 t + a:
    the values lane t of a quad feeds the tensor cores from 8 slices of 16."""
    q = torch.zeros(128, 1, dtype=torch.int32)
    q[32 * 2 + 16 * 1 + 8 * 0 + 2 * 3 + 1, 0] = 5  # w 2, e 1, c 0, t 3, a 1: word 4 t + w = 14, nibble 5
    w = PackedWeight(pack(q, 4), torch.ones(1, 1), torch.zeros(1, 1), 4, 128)
    words = to_mma(w).qweight[0].tolist()
    assert words[14] == 5 << (4 * 5) and sum(map(abs, words)) == words[14]


def test_mma_weights_multiply_alike_on_the_cpu():
    """The CPU's kernels read the rows layout; an mma weight is turned back for them."""
    w = packed_weight(256, 24, 4, 64)
    x = torch.randn(3, 256)
    torch.testing.assert_close(packed_gemm(x, to_mma(w)), packed_gemm(x, w))


def test_device_layout_keeps_rows_on_the_cpu(monkeypatch):
    monkeypatch.setenv("GDSERVE_PACKED_LAYOUT", "mma")  # a CUDA setting: the CPU's kernel takes rows
    w = packed_weight(128, 8, 4, 32)
    assert device_layout(w).layout == "rows" and device_layout(to_mma(w)).layout == "rows"
    assert device_layout(packed_weight(128, 8, 8, 32)).layout == "rows"


def test_cuda_packed_layout_from_the_environment(monkeypatch):
    monkeypatch.delenv("GDSERVE_PACKED_LAYOUT", raising=False)
    assert cuda_packed_layout() in ("rows", "mma")
    for layout in ("rows", "mma"):
        monkeypatch.setenv("GDSERVE_PACKED_LAYOUT", layout)
        assert cuda_packed_layout() == layout
    monkeypatch.setenv("GDSERVE_PACKED_LAYOUT", "marlin")
    with pytest.raises(ValueError, match="GDSERVE_PACKED_LAYOUT='marlin'"):
        cuda_packed_layout()


def test_mma_layout_rejects_what_it_cannot_hold():
    with pytest.raises(ValueError, match="the mma layout holds 4-bit weights, got 8-bit"):
        to_mma(packed_weight(128, 8, 8, 32))
    with pytest.raises(ValueError, match="the mma layout holds 4-bit weights"):
        PackedWeight(torch.zeros(8, 16, dtype=torch.int32), torch.ones(1, 8), torch.zeros(1, 8), 8, 128, "mma")
    with pytest.raises(ValueError, match=r"qweight must have shape \(8, 16\) in the mma layout for 128 x 8"):
        PackedWeight(torch.zeros(8, 8, dtype=torch.int32), torch.ones(1, 8), torch.zeros(1, 8), 4, 128, "mma")
    with pytest.raises(ValueError, match="layout must be one of"):
        PackedWeight(torch.zeros(16, 8, dtype=torch.int32), torch.ones(1, 8), torch.zeros(1, 8), 4, 128, "tiles")
