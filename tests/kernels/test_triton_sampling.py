import pytest
import torch

from gdserve.kernels.sampling import NOISE_BLOCK, gumbel_argmax, gumbel_argmax_reference
from tests.kernels.triton_cases import DEVICE, ON_CUDA, randn, requires_triton

pytestmark = requires_triton
# (rows, vocab): many rows (a span each), few rows (split across programs), a vocabulary that
# ends mid-block and one below a block
CASES = ([(1024, 128256), (3, 128256), (64, 49152), (5, 1000)] if ON_CUDA
         else [(3, 2 * NOISE_BLOCK + 77), (1, 3 * NOISE_BLOCK), (4, 300)])


def case(rows: int, vocab: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(rows + vocab)
    logits = randn(rows, vocab, dtype=dtype, seed=vocab, scale=3.0)
    logits[0, ::3] = float("-inf")  # a guided row: most tokens masked
    temperature = torch.rand(rows, generator=g) * 1.5 + 0.1
    temperature[1::3] = 0.0         # greedy rows among the sampled ones
    seeds = torch.randint(0, 2**62, (rows,), generator=g)
    return logits, temperature.to(DEVICE), seeds.to(DEVICE)


@pytest.mark.parametrize("rows,vocab", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference_token_for_token(rows, vocab, dtype):
    from gdserve.kernels.triton.sampling import gumbel_argmax_triton
    logits, temperature, seeds = case(rows, vocab, dtype)
    expected = gumbel_argmax_reference(logits, temperature, seeds)
    actual = gumbel_argmax_triton(logits, temperature, seeds, NOISE_BLOCK)
    assert actual.dtype == torch.int64
    assert torch.equal(actual.cpu(), expected.cpu())


def test_a_row_of_minus_infinity_but_one_token_draws_that_token():
    from gdserve.kernels.triton.sampling import gumbel_argmax_triton
    logits = torch.full((4, 2 * NOISE_BLOCK + 9), float("-inf"), device=DEVICE)
    allowed = torch.tensor([0, NOISE_BLOCK + 3, 2 * NOISE_BLOCK + 8, 5], device=DEVICE)
    logits[torch.arange(4, device=DEVICE), allowed] = torch.tensor([-50.0, 0.0, 50.0, 1.0], device=DEVICE)
    seeds = torch.arange(4, dtype=torch.int64, device=DEVICE)
    out = gumbel_argmax_triton(logits, torch.ones(4, device=DEVICE), seeds, NOISE_BLOCK)
    assert torch.equal(out, allowed)


@pytest.mark.skipif(not ON_CUDA, reason="dispatch to Triton needs CUDA tensors")
def test_public_op_dispatches_on_cuda():
    logits, temperature, seeds = case(8, 32000, torch.float32)
    assert torch.equal(gumbel_argmax(logits, temperature, seeds), gumbel_argmax_reference(logits, temperature, seeds))
