"""The ShareGPT dataset (vLLM's `--dataset-name sharegpt`): a JSON list of
{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}; a
conversation's first turn is the prompt, the second's token count its max_tokens (unless
--output-len fixes it)."""
import random

from gdserve.bench.datasets.files import parse_json, read_text
from gdserve.bench.datasets.sample import Encode, SampleRequest, oversample

# vLLM's filters: pairs shorter or longer than these are skipped.
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048


def load_sharegpt(path: str) -> list[tuple[str, str]]:
    """The (prompt, completion) texts of every conversation with two turns or more, in file order."""
    data = parse_json(read_text(path), path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations, got a {type(data).__name__}")
    pairs = []
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        texts = [turn.get("value") if isinstance(turn, dict) else None for turn in turns[:2]]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError(f"{path}: entry {i}: its first two turns need a string 'value'")
        pairs.append((texts[0], texts[1]))
    if not pairs:
        raise ValueError(f"{path}: no conversation with two turns (a list of {{\"conversations\": [...]}})")
    return pairs


def is_valid_pair(prompt_len: int, output_len: int, fixed_output_len: bool) -> bool:
    too_short = prompt_len < MIN_LEN or (not fixed_output_len and output_len < MIN_LEN)
    return not too_short and prompt_len <= MAX_PROMPT_LEN and prompt_len + output_len <= MAX_TOTAL_LEN


def sharegpt_requests(pairs: list[tuple[str, str]], encode: Encode, num_prompts: int,
                      output_len: int | None = None, seed: int = 0) -> list[SampleRequest]:
    """The pairs shuffled with the seed, the first num_prompts that pass the length filters
    (topped up with repeats where too few pass)."""
    shuffled = list(pairs)
    random.Random(seed).shuffle(shuffled)
    requests = []
    for prompt, completion in shuffled:
        if len(requests) == num_prompts:
            break
        prompt_ids = encode(prompt)
        max_tokens = len(encode(completion)) if output_len is None else output_len
        if is_valid_pair(len(prompt_ids), max_tokens, output_len is not None):
            requests.append(SampleRequest(prompt_ids, max_tokens))
    if not requests:
        raise ValueError(f"no ShareGPT conversation passes the length filters (prompt {MIN_LEN}-{MAX_PROMPT_LEN} "
                         f"tokens, prompt + output at most {MAX_TOTAL_LEN})")
    return oversample(requests, num_prompts, seed)
