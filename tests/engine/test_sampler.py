import math

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from gdserve.engine.sampler import Sampler, SamplingBatch, inverse_cdf
from gdserve.kernels import apply_token_bitmask, gumbel_argmax
from gdserve.kernels.bitmask import bitmask_width, unpack_bitmask
from gdserve.sampling_params import SamplingParams

V = 64
EOS = 2
# Probabilities of a 10-token vocabulary, in descending order, for the support tests.
PROBS = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.01, 0.005, 0.003, 0.002])


def build(params, prompts=None, outputs=None, generators=None, stop_until_min=None, vocab=V):
    n = len(params)
    prompts, outputs = prompts or [[] for _ in range(n)], outputs or [[] for _ in range(n)]
    return SamplingBatch.build(params, [p + o for p, o in zip(prompts, outputs)], [len(p) for p in prompts],
                               generators or [None] * n, stop_until_min or [set() for _ in range(n)],
                               vocab, "cpu")


@pytest.fixture(params=[False, True], ids=["inverse_cdf", "one_pass"])
def one_pass(request) -> bool:
    """Both draws: the CPU's (inverse CDF) and the device's (gumbel_argmax, its torch reference here)."""
    return request.param


def sample(logits, params, one_pass=False, **kw):
    return Sampler(one_pass)(logits.clone(), build(params, vocab=logits.shape[1], **kw))


def random_logits(n, vocab=V, seed=0):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def support(logits_row, params, one_pass, num=4000):
    torch.manual_seed(0)
    out = sample(logits_row.expand(num, -1), [params] * num, one_pass)
    return set(out.token_ids.tolist())


def test_greedy_is_argmax(one_pass):
    logits = random_logits(8)
    out = sample(logits, [SamplingParams(temperature=0)] * 8, one_pass)
    assert torch.equal(out.token_ids, logits.argmax(-1))
    assert out.logprobs is None and out.top_logprobs is None


def test_plain_greedy_batch_builds_no_feature():
    b = build([SamplingParams(temperature=0, top_k=5, top_p=0.5)] * 3)
    assert b.sample_rows.numel() == 0
    assert b.logit_bias is None and b.min_tokens_mask is None and b.repetition is None
    assert b.frequency_presence is None and b.max_num_logprobs is None


def test_plain_sampled_batch_skips_truncation():
    b = build([SamplingParams(temperature=0.7)] * 3)
    assert b.top_k is None and b.top_p is None and b.min_p is None


def test_no_sort_without_top_p(monkeypatch, one_pass):
    def no_sort(*args, **kwargs):
        raise AssertionError("sorted the vocabulary")
    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    params = [SamplingParams(top_k=5), SamplingParams(min_p=0.1), SamplingParams(),
              SamplingParams(temperature=0)]
    out = sample(random_logits(4), params, one_pass)
    assert out.token_ids.shape == (4,)


def test_top_k_1_is_greedy(one_pass):
    logits = random_logits(16)
    out = sample(logits, [SamplingParams(temperature=1.5, top_k=1)] * 16, one_pass)
    assert torch.equal(out.token_ids, logits.argmax(-1))


def test_greedy_rows_unaffected_by_sampled_rows(one_pass):
    logits = random_logits(6)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_p=0.5, logit_bias={3: 50}),
              SamplingParams(temperature=0), SamplingParams(temperature=2.0, top_k=3, repetition_penalty=1.5),
              SamplingParams(temperature=0.5, min_p=0.1, presence_penalty=1.0), SamplingParams(temperature=0)]
    outputs = [[1, 2], [3], [4, 4], [5], [6, 7], []]
    for seed in range(5):
        torch.manual_seed(seed)
        out = sample(logits, params, one_pass, outputs=outputs)
        for row in (0, 2, 5):
            assert out.token_ids[row] == logits[row].argmax()


def run_seeded(row_logits, params, seed, others, position, one_pass, steps=20):
    """Sample `steps` tokens for one seeded row placed at `position` among `others`."""
    gen = torch.Generator().manual_seed(seed)
    tokens = []
    for step in range(steps):
        rows = others[:position] + [params] + others[position:]
        logits = torch.cat([random_logits(position, seed=100 + step), row_logits[step:step + 1],
                            random_logits(len(others) - position, seed=200 + step)])
        gens = [None] * len(rows)
        gens[position] = gen
        for i, p in enumerate(rows):
            if p.seed is not None and i != position:
                gens[i] = torch.Generator().manual_seed(p.seed + step)
        torch.manual_seed(1000 + step)
        tokens.append(sample(logits, rows, one_pass, generators=gens).token_ids[position].item())
    return tokens


def test_seeded_row_independent_of_batch(one_pass):
    row_logits = random_logits(20, seed=7)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=123)
    alone = run_seeded(row_logits, params, 123, [], 0, one_pass)
    others = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=5),
              SamplingParams(temperature=1.2, seed=9), SamplingParams(temperature=1.0, min_p=0.2)]
    assert run_seeded(row_logits, params, 123, others, 2, one_pass) == alone
    assert run_seeded(row_logits, params, 123, others[:1], 1, one_pass) == alone
    assert run_seeded(row_logits, params, 123, others * 3, 5, one_pass) == alone
    assert run_seeded(row_logits, params, 124, others, 2, one_pass) != alone


@pytest.mark.parametrize("params, allowed", [
    (SamplingParams(top_k=3), {0, 1, 2}),
    (SamplingParams(top_p=0.7), {0, 1, 2}),
    (SamplingParams(top_p=0.6), {0, 1}),
    (SamplingParams(top_k=3, top_p=0.6), {0, 1}),  # top_p over the renormalized top 3
    (SamplingParams(min_p=0.3), {0, 1, 2}),
    (SamplingParams(min_p=0.2), {0, 1, 2, 3}),
    (SamplingParams(temperature=0.5, top_k=4, min_p=0.1), {0, 1, 2}),  # min_p after temperature
])
def test_truncation_restricts_support(params, allowed, one_pass):
    assert support(PROBS.log(), params, one_pass) == allowed


def test_rows_without_truncation_keep_full_support_in_truncating_batch(one_pass):
    torch.manual_seed(0)
    n = 6000
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.3), SamplingParams()] * (n // 3)
    out = sample(PROBS.log().expand(n, -1), params, one_pass).token_ids.view(-1, 3)
    assert set(out[:, 0].tolist()) == {0, 1}
    assert set(out[:, 1].tolist()) == {0}
    assert len(set(out[:, 2].tolist())) >= 8


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_matches_softmax(temperature, one_pass):
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
    n = 40000
    out = sample(logits.expand(n, -1), [SamplingParams(temperature=temperature)] * n, one_pass)
    counts = torch.bincount(out.token_ids, minlength=8).float()
    # 7 degrees of freedom: P(chi2 > 30) is about 1e-4.
    assert chi_square(counts, torch.softmax(logits / temperature, -1)) < 30


@pytest.mark.parametrize("u, expected", [(0.0, 1), (1.0 - 2 ** -24, 3), (1.0, 3)])
def test_inverse_cdf_never_draws_a_masked_token(monkeypatch, u, expected):
    """Tokens of probability 0 before, between and after the allowed ones (a grammar's mask), at
    the ends of the uniform's range (and past it, as rounding could put u * total)."""
    logits = torch.tensor([[float("-inf"), 0.0, float("-inf"), 0.0, float("-inf"), float("-inf")]])
    monkeypatch.setattr(torch.Tensor, "uniform_", lambda self, *a, **k: self.fill_(u))
    assert inverse_cdf(logits.clone(), build([SamplingParams()], vocab=6)).tolist() == [expected]


def test_seeded_sampling_matches_softmax(one_pass):
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5]])
    gen = torch.Generator().manual_seed(5)
    params = [SamplingParams(seed=5)]
    sampler = Sampler(one_pass)
    tokens = [sampler(logits.clone(), build(params, generators=[gen], vocab=4)).token_ids.item()
              for _ in range(3000)]
    counts = torch.bincount(torch.tensor(tokens), minlength=4).float()
    assert chi_square(counts, torch.softmax(logits[0], -1)) < 22  # 3 dof: P about 1e-4


def test_repetition_penalty_matches_hf():
    logits = random_logits(3)
    prompts, outputs = [[1, 5, 9], [10, 11], [3]], [[5, 20, 20], [], [4, 63]]
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams(repetition_penalty=0.8),
              SamplingParams()]
    got = Sampler.process_logits(logits.clone(), build(params, prompts, outputs))
    for row, p in enumerate(params):
        ids = torch.tensor([prompts[row] + outputs[row]])
        ref = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, logits[row:row + 1].clone())
        torch.testing.assert_close(got[row], ref[0])


def test_presence_frequency_penalties_over_output_only():
    logits = random_logits(2)
    prompts, outputs = [[7, 7, 8], [1]], [[3, 3, 3, 9], [1, 2]]
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
              SamplingParams(presence_penalty=-1.0)]
    got = Sampler.process_logits(logits.clone(), build(params, prompts, outputs))
    ref = logits.clone()
    for row, p in enumerate(params):
        for token in set(outputs[row]):
            ref[row, token] -= p.frequency_penalty * outputs[row].count(token) + p.presence_penalty
    torch.testing.assert_close(got, ref)


def test_logit_bias_forces_and_blocks(one_pass):
    logits = random_logits(4)
    top = logits.argmax(-1)
    params = [SamplingParams(temperature=0, logit_bias={"17": 100}),
              SamplingParams(temperature=0, logit_bias={int(top[1]): -100}),
              SamplingParams(temperature=1.0, logit_bias={40: 100}),
              SamplingParams(temperature=0)]
    out = sample(logits, params, one_pass).token_ids
    assert out[0] == 17 and out[2] == 40 and out[3] == top[3]
    assert out[1] != top[1]


def test_min_tokens_blocks_stop_ids(one_pass):
    logits = random_logits(4)
    logits[:, EOS] = logits[:, 9] = 100.0
    params = [SamplingParams(temperature=0, min_tokens=3)] * 2 + [SamplingParams(min_tokens=3)] * 2
    out = sample(logits, params, one_pass, stop_until_min=[{EOS, 9}, set(), {EOS, 9}, set()]).token_ids
    assert out[0] not in (EOS, 9) and out[2] not in (EOS, 9)
    assert out[1] in (EOS, 9)


def test_logprobs_and_top_logprobs(one_pass):
    logits = random_logits(4)
    params = [SamplingParams(temperature=0, logprobs=3), SamplingParams(logprobs=0),
              SamplingParams(temperature=0.5), SamplingParams(temperature=0, logprobs=5, logit_bias={1: 2.0})]
    out = sample(logits, params, one_pass)
    processed = logits.clone()
    processed[3, 1] += 2.0
    ref = torch.log_softmax(processed, -1)  # before temperature: row 2's value is at temperature 1
    torch.testing.assert_close(out.logprobs, ref.gather(1, out.token_ids[:, None]).squeeze(1))
    ids, values = out.top_logprobs
    assert ids.shape == values.shape == (4, 5)
    assert torch.all(values[:, :-1] >= values[:, 1:])
    torch.testing.assert_close(values, ref.gather(1, ids))
    assert torch.equal(ids[:, 0], ref.argmax(-1))


def test_logprobs_zero_gives_only_sampled(one_pass):
    out = sample(random_logits(2), [SamplingParams(logprobs=0), SamplingParams()], one_pass)
    assert out.logprobs.shape == (2,) and out.top_logprobs is None
    assert torch.all(out.logprobs <= 0) and not torch.any(torch.isinf(out.logprobs))


def test_logprob_of_masked_eos_is_minus_inf(one_pass):
    logits = random_logits(1)
    out = sample(logits, [SamplingParams(temperature=0, logprobs=1)], one_pass, stop_until_min=[{EOS}])
    ids, values = out.top_logprobs
    assert ids[0, 0] != EOS
    lp = Sampler.process_logits(logits.clone(), build([SamplingParams()], stop_until_min=[{EOS}]))
    assert math.isinf(lp[0, EOS]) and lp[0, EOS] < 0


# ---- logits in the model's dtype ---------------------------------------------------------------

HALF_DTYPES = [torch.bfloat16, torch.float16]


def sample_seeded(logits, params, one_pass, seed=0, **kw):
    """sample() with every row's noise fixed: seeded rows by their own generators, the others by
    the default RNG reset to seed."""
    generators = [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in params]
    torch.manual_seed(seed)
    return sample(logits, params, one_pass, generators=generators, **kw)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_plain_sampling_of_half_logits_draws_the_tokens_of_their_float32_copy(dtype, one_pass):
    half = (random_logits(48, vocab=500, seed=3) * 2).to(dtype)
    params = [SamplingParams(temperature=t, seed=s) for t, s in
              [(0, None), (1.0, None), (0.7, 11), (1.3, None), (0, None), (0.5, 12)]] * 8
    for seed in range(3):
        out = sample_seeded(half, params, one_pass, seed)
        assert torch.equal(out.token_ids, sample_seeded(half.float(), params, one_pass, seed).token_ids)
    greedy_rows = [i for i, p in enumerate(params) if p.temperature == 0]
    assert torch.equal(out.token_ids[greedy_rows], half.float()[greedy_rows].argmax(-1))
    sampled_rows = [i for i, p in enumerate(params) if p.temperature > 0]
    assert not torch.equal(out.token_ids[sampled_rows], half.float()[sampled_rows].argmax(-1))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("params", [
    [SamplingParams(logprobs=3), SamplingParams(temperature=0, logprobs=0), SamplingParams(temperature=0.8)],
    [SamplingParams(repetition_penalty=1.4), SamplingParams(temperature=0, frequency_penalty=0.5,
                                                           presence_penalty=0.3), SamplingParams()],
    [SamplingParams(top_p=0.6, logprobs=2), SamplingParams(top_k=5, seed=3), SamplingParams(min_p=0.2)],
    [SamplingParams(logit_bias={7: 3.5}, logprobs=1), SamplingParams(min_tokens=2), SamplingParams(temperature=0)],
], ids=["logprobs", "penalties", "truncation", "bias_and_min_tokens"])
def test_features_on_half_logits_give_the_tokens_and_logprobs_of_their_float32_copy(dtype, params, one_pass):
    rows = params * 6
    half = random_logits(len(rows), seed=4).to(dtype)
    kw = dict(outputs=[[1, 5, 5], [9], [EOS, 7]] * 6, stop_until_min=[{EOS, 9}] * len(rows))
    for seed in range(3):
        out = sample_seeded(half, rows, one_pass, seed, **kw)
        ref = sample_seeded(half.float(), rows, one_pass, seed, **kw)
        assert torch.equal(out.token_ids, ref.token_ids)
        if ref.logprobs is not None:
            assert out.logprobs.dtype == torch.float32 and torch.equal(out.logprobs, ref.logprobs)
        if ref.top_logprobs is not None:
            assert all(torch.equal(a, b) for a, b in zip(out.top_logprobs, ref.top_logprobs))


@pytest.mark.parametrize("params, dtype", [
    ([SamplingParams(), SamplingParams(temperature=0.6), SamplingParams(temperature=0)], torch.bfloat16),
    ([SamplingParams(), SamplingParams(logprobs=1)], torch.float32),
    ([SamplingParams(), SamplingParams(top_p=0.9)], torch.float32),
    ([SamplingParams(), SamplingParams(top_k=9)], torch.float32),
    ([SamplingParams(), SamplingParams(repetition_penalty=1.1)], torch.float32),
    ([SamplingParams(), SamplingParams(logit_bias={3: 1.0})], torch.float32),
])
def test_only_a_batch_without_features_draws_from_the_models_dtype(monkeypatch, params, dtype):
    """The one-pass draw takes bfloat16 logits as they come; a feature first widens them to float32."""
    from gdserve.engine import sampler
    seen = []

    def recording(logits, temperature, seeds):
        seen.append(logits.dtype)
        return gumbel_argmax(logits, temperature, seeds)

    monkeypatch.setattr(sampler, "gumbel_argmax", recording)
    sample(random_logits(len(params)).bfloat16(), params, one_pass=True, outputs=[[4]] * len(params))
    assert seen == [dtype]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_grammar_mask_on_half_logits_blocks_the_tokens_it_blocks_in_float32(dtype, one_pass):
    """apply_token_bitmask in place on the model's logits (bfloat16: the native CPU kernel;
    float16: the torch reference), then the sampler, as the engine runs them."""
    n, vocab = 12, 300
    half = random_logits(n, vocab=vocab, seed=5).to(dtype)
    bitmask = torch.randint(-2**31, 2**31, (n, bitmask_width(vocab)),
                            generator=torch.Generator().manual_seed(6), dtype=torch.int64).to(torch.int32)
    bitmask[0] = 0
    bitmask[0, 3] = 1 << 4  # one token allowed: 3 * 32 + 4
    masked, masked_float = half.clone(), half.float()
    apply_token_bitmask(masked, bitmask)
    apply_token_bitmask(masked_float, bitmask)
    assert masked.dtype == dtype and torch.equal(masked.float(), masked_float)
    allowed = unpack_bitmask(bitmask, vocab)
    assert torch.equal(torch.isinf(masked), ~allowed) and torch.equal(masked[allowed], half[allowed])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.2, seed=2), SamplingParams()] * 4
    out = sample_seeded(masked, params, one_pass)
    assert torch.equal(out.token_ids, sample_seeded(masked_float, params, one_pass).token_ids)
    assert allowed[torch.arange(n), out.token_ids].all() and out.token_ids[0] == 3 * 32 + 4
