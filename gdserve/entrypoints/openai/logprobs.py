"""The engine's per-token {token_id: logprob} dicts (sampled token first) in OpenAI's shapes."""
from functools import lru_cache

# A token the constraint (or logit_bias) rules out has logprob -inf, which JSON cannot carry: it is
# reported as this, like vLLM does.
MIN_LOGPROB = -9999.0


class TokenText:
    """Token id -> its text, cached (decoding one token at a time is slow)."""

    def __init__(self, tokenizer):
        self.decode = lru_cache(maxsize=1 << 16)(lambda t: tokenizer.decode([t]))


def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    return [(t, _logprob(entry, t)) for t, _ in sorted(entry.items(), key=lambda kv: -kv[1])[:k]]


def _logprob(entry: dict[int, float], token_id: int) -> float:
    return max(entry[token_id], MIN_LOGPROB)


def chat_logprobs(text: TokenText, token_ids: list[int], entries: list[dict[int, float]],
                  k: int) -> list[dict]:
    """`choices[].logprobs.content` of a chat completion."""
    def item(t: int, lp: float) -> dict:
        s = text.decode(t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode())}

    return [{**item(t, _logprob(e, t)), "top_logprobs": [item(u, lp) for u, lp in _top(e, k)]}
            for t, e in zip(token_ids, entries)]


def completion_logprobs(text: TokenText, token_ids: list[int], entries: list[dict[int, float]],
                        k: int, offset: int) -> dict:
    """`choices[].logprobs` of a completion; text offsets start at `offset`."""
    tokens = [text.decode(t) for t in token_ids]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": [_logprob(e, t) for t, e in zip(token_ids, entries)],
            "top_logprobs": [{text.decode(u): lp for u, lp in _top(e, k)} for e in entries],
            "text_offset": offsets}
