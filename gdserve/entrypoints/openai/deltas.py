"""Cumulative engine outputs -> per-choice deltas for streaming."""
from dataclasses import dataclass

from gdserve.outputs import CompletionOutput


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    first: bool  # the choice's first delta
    offset: int  # chars of the choice's text sent before this delta


class DeltaTracker:
    def __init__(self):
        self._sent: dict[int, tuple[int, int]] = {}  # choice index -> (chars, tokens) sent
        self._finished: set[int] = set()

    def delta(self, index: int, c: CompletionOutput) -> Delta | None:
        """What choice `index` gained since the last call, or None if nothing."""
        if index in self._finished:
            return None
        first = index not in self._sent
        chars, tokens = self._sent.get(index, (0, 0))
        text, token_ids = c.text[chars:], c.token_ids[tokens:]
        logprobs = c.logprobs[tokens:] if c.logprobs is not None else None
        if not first and not text and not token_ids and c.finish_reason is None:
            return None
        self._sent[index] = (len(c.text), len(c.token_ids))
        if c.finish_reason is not None:
            self._finished.add(index)
        return Delta(text, token_ids, logprobs, c.finish_reason, first, chars)
