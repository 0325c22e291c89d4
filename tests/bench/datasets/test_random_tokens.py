"""The random dataset: lengths within vLLM's range-ratio bounds, a shared prefix, no special
tokens, the same requests for the same seed."""
import numpy as np
import pytest

from gdserve.bench.datasets.random_tokens import allowed_token_ids, length_bounds, random_requests
from gdserve.models.loader import load_tokenizer

TOKENS = np.arange(10, 500)


def test_without_a_range_every_length_is_the_one_asked_for():
    requests = random_requests(20, input_len=30, output_len=7, token_ids=TOKENS, prefix_len=5)
    assert len(requests) == 20
    assert {r.prompt_len for r in requests} == {35}
    assert {r.expected_output_len for r in requests} == {7}


@pytest.mark.parametrize("length, ratio, bounds", [(100, 0.1, (90, 110)), (10, 0.25, (7, 13)), (64, 0.0, (64, 64)),
                                                   (3, 0.5, (1, 5))])
def test_bounds_are_floor_and_ceil_of_the_range(length, ratio, bounds):
    assert length_bounds(length, ratio) == bounds


def test_lengths_spread_over_the_whole_range():
    requests = random_requests(400, input_len=100, output_len=20, token_ids=TOKENS, range_ratio=0.1, seed=3)
    inputs = {r.prompt_len for r in requests}
    outputs = {r.expected_output_len for r in requests}
    assert min(inputs) == 90 and max(inputs) == 110 and len(inputs) == 21
    assert min(outputs) == 18 and max(outputs) == 22


def test_outputs_are_at_least_one_token():
    requests = random_requests(200, input_len=20, output_len=1, token_ids=TOKENS, range_ratio=0.9)
    assert min(r.expected_output_len for r in requests) == 1
    assert max(r.expected_output_len for r in requests) == 2


def test_the_prefix_is_shared_and_the_rest_is_not():
    requests = random_requests(5, input_len=16, output_len=4, token_ids=TOKENS, prefix_len=6, seed=1)
    assert len({tuple(r.prompt_token_ids[:6]) for r in requests}) == 1
    assert len({tuple(r.prompt_token_ids[6:]) for r in requests}) == 5


def test_the_same_seed_gives_the_same_requests():
    def draw(seed):
        return random_requests(8, input_len=12, output_len=6, token_ids=TOKENS, range_ratio=0.5, prefix_len=2,
                               seed=seed)
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_token_ids_are_drawn_from_the_allowed_ones(tiny_llama_dir):
    allowed = allowed_token_ids(load_tokenizer(tiny_llama_dir))
    assert sorted(allowed) == list(range(3, 259))  # the byte tokens, not <|endoftext|>, <|im_start|>, <|im_end|>
    requests = random_requests(10, input_len=50, output_len=2, token_ids=allowed, prefix_len=3)
    assert all(3 <= t < 259 and isinstance(t, int) for r in requests for t in r.prompt_token_ids)


@pytest.mark.parametrize("kwargs, message", [
    (dict(range_ratio=1.0), r"--range-ratio must be in \[0, 1\)"),
    (dict(range_ratio=-0.1), r"--range-ratio must be in \[0, 1\)"),
    (dict(input_len=0), "--input-len and --output-len must be >= 1"),
    (dict(prefix_len=-1), "--prefix-len must be >= 0"),
    (dict(input_len=1, range_ratio=0.5), "allows empty prompts"),
])
def test_bad_lengths_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        random_requests(4, **{"input_len": 8, "output_len": 4, "token_ids": TOKENS, **kwargs})
