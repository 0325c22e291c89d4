"""A dataset's request, and what every dataset does once it has drawn its requests."""
import random
from collections.abc import Callable
from dataclasses import dataclass

Encode = Callable[[str], list[int]]  # text -> token ids, as the engine tokenizes a text prompt


@dataclass(frozen=True)
class SampleRequest:
    prompt_token_ids: list[int]
    expected_output_len: int  # the request's max_tokens; it runs to it (EOS ignored)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def encoder(tokenizer) -> Encode:
    """The tokenizer's ids for a text, special tokens included (a BOS where the tokenizer adds one)."""
    return lambda text: tokenizer(text).input_ids


def oversample(requests: list[SampleRequest], num_prompts: int, seed: int) -> list[SampleRequest]:
    """Fewer requests than asked for are topped up with repeats drawn with the seed, as vLLM does."""
    if not requests:
        raise ValueError("the dataset gave no request")
    rng = random.Random(seed)
    return requests + [rng.choice(requests) for _ in range(num_prompts - len(requests))]
