import pytest
import torch

from gdserve.kernels.sampling import NOISE_BLOCK, gumbel_argmax, philox_uniforms


def test_philox_matches_the_published_known_answer():
    """Philox-4x32-10 of counter 0 under key 0 (Random123's known-answer vector)."""
    from gdserve.kernels.sampling import _philox
    words = _philox(torch.tensor([0]), torch.tensor([0]))
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_uniforms_lie_in_the_open_unit_interval_and_differ_by_seed_and_token():
    u = philox_uniforms(torch.tensor([0, 1, 2**40 + 3]), 3 * NOISE_BLOCK + 5)
    assert u.shape == (3, 3 * NOISE_BLOCK + 5) and u.dtype == torch.float32
    assert (u > 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.01
    assert len(torch.unique(u[0])) > 0.99 * u.shape[1]
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[1], u[2])


def test_draws_follow_softmax_of_logits_over_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])
    rows = 40_000
    for temperature in (1.0, 0.5):
        tokens = gumbel_argmax(logits.expand(rows, -1).clone(), torch.full((rows,), temperature),
                               torch.arange(rows, dtype=torch.int64) * 7919)
        freq = torch.bincount(tokens, minlength=5).float() / rows
        expected = torch.softmax(logits / temperature, dim=0)
        sigma = (expected * (1 - expected) / rows).sqrt()
        assert ((freq - expected).abs() <= 5 * sigma + 1e-9).all(), (temperature, freq, expected)
        assert freq[4] == 0  # -inf is never drawn


def test_temperature_zero_takes_the_argmax_and_the_same_seed_the_same_token():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3000, generator=g)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.7, 1.3, 1.0])
    seeds = torch.randint(0, 2**62, (6,), generator=g)
    first = gumbel_argmax(logits, temperature, seeds)
    assert torch.equal(first[[0, 2]], logits[[0, 2]].argmax(dim=1))
    assert torch.equal(gumbel_argmax(logits, temperature, seeds), first)
    # a row's draw depends on its own logits, temperature and seed only
    alone = gumbel_argmax(logits[3:4], temperature[3:4], seeds[3:4])
    assert alone.item() == first[3].item()
    other = gumbel_argmax(logits, temperature, seeds + 1)
    assert not torch.equal(other[[1, 3, 4, 5]], first[[1, 3, 4, 5]])


def test_a_single_allowed_token_is_always_drawn():
    logits = torch.full((64, 5000), float("-inf"))
    allowed = torch.randint(0, 5000, (64,), generator=torch.Generator().manual_seed(1))
    logits[torch.arange(64), allowed] = torch.randn(64) * 30
    assert torch.equal(gumbel_argmax(logits, torch.ones(64), torch.arange(64, dtype=torch.int64)), allowed)


@pytest.mark.parametrize("logits, temperature, seeds, message", [
    (torch.zeros(2, 5), torch.ones(3), torch.zeros(2, dtype=torch.int64), "temperature and seeds"),
    (torch.zeros(5), torch.ones(5), torch.zeros(5, dtype=torch.int64), "must be"),
    (torch.zeros(2, 5), torch.ones(2), torch.zeros(2, dtype=torch.int32), "seeds must be int64"),
])
def test_bad_shapes_and_dtypes_are_named(logits, temperature, seeds, message):
    with pytest.raises(ValueError, match=message):
        gumbel_argmax(logits, temperature, seeds)
