import pytest
import torch

from gdserve.kernels import apply_token_bitmask
from gdserve.kernels.bitmask import bitmask_width
from tests.kernels.test_bitmask import random_bitmask
from tests.kernels.triton_cases import DEVICE, ON_CUDA, randn, requires_triton

pytestmark = requires_triton
# (rows, vocab, words): words equal to, above (tail ignored) and below (tokens past W * 32
# disallowed) the vocabulary's width.
CASES = ([(256, 128256, 4008), (64, 49152, 1536), (7, 32000, 999)] if ON_CUDA
         else [(3, 96, 3), (4, 100, 4), (2, 130, 4), (3, 5000, bitmask_width(5000))])


@pytest.mark.parametrize("rows,vocab,words", CASES)
@pytest.mark.parametrize("with_indices", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(rows, vocab, words, with_indices, dtype):
    from gdserve.kernels.triton.bitmask import apply_token_bitmask_triton
    logits = randn(rows, vocab, dtype=dtype)
    # With indices, only every other row is guided, in shuffled order; the others stay untouched.
    indices = torch.randperm(rows, generator=torch.Generator().manual_seed(rows))[: (rows + 1) // 2]
    bitmask = random_bitmask(len(indices) if with_indices else rows, words, seed=vocab)
    bitmask[0, 0] = 0  # a row that allows none of its first 32 tokens
    expected = logits.cpu().clone()
    apply_token_bitmask(expected, bitmask, indices if with_indices else None)  # the CPU reference
    apply_token_bitmask_triton(logits, bitmask.to(DEVICE), indices.to(DEVICE) if with_indices else None,
                               block=4096 if ON_CUDA else 64)
    assert torch.equal(logits.cpu(), expected)


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
def test_public_op_dispatches_on_cuda():
    logits = torch.zeros(3, 64, device=DEVICE)
    apply_token_bitmask(logits, torch.tensor([[5, 0]], dtype=torch.int32), torch.tensor([1]))
    assert not torch.isinf(logits[[0, 2]]).any()
    assert torch.isinf(logits[1]).sum() == 62 and logits[1, 0] == 0 and logits[1, 2] == 0
