import pytest
import torch

from gdserve.kernels import apply_token_bitmask
from gdserve.kernels.bitmask import allocate_token_bitmask, unpack_bitmask


def reference_apply(logits: torch.Tensor, bitmask: torch.Tensor, indices) -> torch.Tensor:
    """One token at a time: logits[r, i] = -inf unless bit i % 32 of word i // 32 is set."""
    out = logits.clone()
    rows = range(logits.shape[0]) if indices is None else indices
    for j, r in enumerate(rows):
        for i in range(logits.shape[1]):
            word = i // 32
            allowed = word < bitmask.shape[1] and (int(bitmask[j, word]) >> (i % 32)) & 1
            if not allowed:
                out[r, i] = float("-inf")
    return out


def random_bitmask(rows: int, words: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-2**31, 2**31, (rows, words), generator=g, dtype=torch.int64)
    return words.to(torch.int32)


@pytest.mark.parametrize("vocab, words", [(96, 3), (100, 4), (130, 4), (64, 3)])
@pytest.mark.parametrize("with_indices", [False, True])
def test_apply_matches_reference(vocab, words, with_indices):
    """V equal to, below (tail ignored) and above (tokens past W * 32 disallowed) the mask width."""
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(1))
    indices = torch.tensor([4, 0, 2]) if with_indices else None
    bitmask = random_bitmask(3 if with_indices else 5, words, seed=vocab)
    expected = reference_apply(logits, bitmask, None if indices is None else indices.tolist())
    apply_token_bitmask(logits, bitmask, indices)
    assert torch.equal(logits, expected)


def test_rows_without_an_index_are_untouched():
    logits = torch.randn(4, 64)
    before = logits.clone()
    apply_token_bitmask(logits, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([2]))
    assert torch.equal(logits[[0, 1, 3]], before[[0, 1, 3]]) and torch.isinf(logits[2]).all()


def test_sign_bit_is_token_31():
    bitmask = torch.tensor([[-2**31, 1]], dtype=torch.int32)
    assert unpack_bitmask(bitmask, 64)[0].nonzero().flatten().tolist() == [31, 32]


def test_allocate_allows_everything_and_half_precision():
    bitmask = allocate_token_bitmask(2, 49152)
    assert bitmask.shape == (2, 1536) and bitmask.dtype == torch.int32 and (bitmask == -1).all()
    logits = torch.zeros(2, 49152, dtype=torch.bfloat16)
    bitmask[1, 0] = 0b101
    apply_token_bitmask(logits, bitmask)
    assert not torch.isinf(logits[0]).any()
    assert torch.isinf(logits[1]).sum() == 30 and logits[1, 0] == 0 and logits[1, 2] == 0


def test_too_few_bitmask_rows():
    with pytest.raises(ValueError, match="1 rows for 2 logits rows"):
        apply_token_bitmask(torch.zeros(2, 32), torch.zeros(1, 1, dtype=torch.int32))


def test_logits_from_inference_mode():
    with torch.inference_mode():
        logits = torch.zeros(2, 32)
    apply_token_bitmask(logits, torch.ones(1, 1, dtype=torch.int32), torch.tensor([1]))
    apply_token_bitmask(logits, torch.ones(2, 1, dtype=torch.int32))
    assert logits[:, 0].eq(0).all() and torch.isinf(logits[:, 1:]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_indices", [False, True])
def test_native_and_torch_reference_agree(dtype, with_indices):
    """The CPU's native kernel against the torch reference: full-width rows (all-ones words
    skipped), a vocab past the mask, strided logits rows."""
    from gdserve.kernels.bitmask import apply_token_bitmask_reference
    logits = torch.randn(6, 1100, generator=torch.Generator().manual_seed(2)).to(dtype)[:, :1000]
    bitmask = random_bitmask(4 if with_indices else 6, 30, seed=3)
    bitmask[0, :10] = -1
    indices = torch.tensor([5, 1, 0, 3]) if with_indices else None
    expected = logits.clone()
    apply_token_bitmask_reference(expected, bitmask, indices)
    apply_token_bitmask(logits, bitmask, indices)
    assert torch.equal(logits, expected) and torch.isinf(logits).any()


def test_indices_outside_the_logits_rows_raise():
    with pytest.raises(IndexError):
        apply_token_bitmask(torch.zeros(2, 32), torch.zeros(1, 1, dtype=torch.int32), torch.tensor([2]))
