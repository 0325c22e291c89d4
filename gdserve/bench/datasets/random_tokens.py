"""The random dataset: prompts of random token ids, lengths drawn around --input-len and
--output-len (vLLM's `--dataset-name random`)."""
import math

import numpy as np

from gdserve.bench.datasets.sample import SampleRequest


def length_bounds(length: int, range_ratio: float, minimum: int = 0) -> tuple[int, int]:
    """[floor(length * (1 - range_ratio)), ceil(length * (1 + range_ratio))], both at least minimum."""
    # Rounded first, so that 100 * 1.1 = 110.00000000000001 does not ceil to 111.
    low = math.floor(round(length * (1 - range_ratio), 9))
    high = math.ceil(round(length * (1 + range_ratio), 9))
    return max(low, minimum), max(high, minimum)


def check_random_lengths(input_len: int, output_len: int, range_ratio: float, prefix_len: int) -> None:
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--range-ratio must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise ValueError(f"--input-len and --output-len must be >= 1, got {input_len} and {output_len}")
    if prefix_len < 0:
        raise ValueError(f"--prefix-len must be >= 0, got {prefix_len}")
    if prefix_len + length_bounds(input_len, range_ratio)[0] < 1:
        raise ValueError(f"--input-len {input_len} with --range-ratio {range_ratio} allows empty prompts")


def allowed_token_ids(tokenizer) -> np.ndarray:
    """The tokenizer's base vocabulary less its special tokens (those of a role, like EOS, and any
    other token added as special)."""
    special = set(tokenizer.all_special_ids)
    special |= {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    return np.array([i for i in range(tokenizer.vocab_size) if i not in special])


def random_requests(num_prompts: int, input_len: int, output_len: int, token_ids: np.ndarray,
                    range_ratio: float = 0.0, prefix_len: int = 0, seed: int = 0) -> list[SampleRequest]:
    """num_prompts prompts, each the same prefix_len random tokens then its own input length of
    random tokens (uniform in length_bounds(input_len, range_ratio)), drawn from token_ids; output
    lengths uniform in length_bounds(output_len, range_ratio), at least 1. The same seed gives the
    same requests."""
    check_random_lengths(input_len, output_len, range_ratio, prefix_len)
    rng = np.random.default_rng(seed)
    input_low, input_high = length_bounds(input_len, range_ratio)
    output_low, output_high = length_bounds(output_len, range_ratio, minimum=1)
    input_lens = rng.integers(input_low, input_high + 1, size=num_prompts)
    output_lens = rng.integers(output_low, output_high + 1, size=num_prompts)
    prefix = rng.choice(token_ids, size=prefix_len).tolist()
    return [SampleRequest(prefix + rng.choice(token_ids, size=int(n)).tolist(), int(o))
            for n, o in zip(input_lens, output_lens)]
