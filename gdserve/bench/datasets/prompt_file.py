"""The json dataset: a JSONL file of {"prompt": str, "max_tokens": int}, one request a line (or
a JSON list of them); with --output-len, max_tokens may be left out and is overridden."""
import random
from dataclasses import dataclass

from gdserve.bench.datasets.files import parse_json, read_text
from gdserve.bench.datasets.sample import Encode, SampleRequest, oversample


@dataclass(frozen=True)
class PromptEntry:
    prompt: str
    max_tokens: int | None


def load_prompts(path: str, need_max_tokens: bool = True) -> list[PromptEntry]:
    text = read_text(path)
    if text.lstrip().startswith("["):
        items = parse_json(text, path)
        located = [(f"{path}: entry {i}", item) for i, item in enumerate(items)]
    else:
        located = [(f"{path}: line {n}", parse_json(line, f"{path}: line {n}"))
                   for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not located:
        raise ValueError(f"{path}: no prompt in the file")
    return [prompt_entry(item, where, need_max_tokens) for where, item in located]


def prompt_entry(item, where: str, need_max_tokens: bool) -> PromptEntry:
    if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
        raise ValueError(f'{where}: expected {{"prompt": str, "max_tokens": int}}')
    max_tokens = item.get("max_tokens")
    if max_tokens is None and need_max_tokens:
        raise ValueError(f"{where}: no max_tokens (give one, or --output-len for every prompt)")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise ValueError(f"{where}: max_tokens must be an integer >= 1, got {max_tokens!r}")
    return PromptEntry(item["prompt"], max_tokens)


def prompt_requests(entries: list[PromptEntry], encode: Encode, num_prompts: int | None = None,
                    output_len: int | None = None, seed: int = 0) -> list[SampleRequest]:
    """Every entry in file order; with num_prompts, that many drawn with the seed (topped up with
    repeats beyond the file's count). output_len overrides each entry's max_tokens."""
    if num_prompts is not None:
        entries = list(entries)
        random.Random(seed).shuffle(entries)
        entries = entries[:num_prompts]
    if output_len is None and any(e.max_tokens is None for e in entries):
        raise ValueError("a prompt without max_tokens needs --output-len")
    requests = [SampleRequest(encode(e.prompt), e.max_tokens if output_len is None else output_len)
                for e in entries]
    return requests if num_prompts is None else oversample(requests, num_prompts, seed)
