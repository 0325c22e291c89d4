"""Admission control: KV blocks held back for the tokens running sequences are still expected to
write, so that admitting a new sequence does not push older ones into preemption later.

A sequence is expected to generate `ratio` of the output tokens it may still produce, where ratio
is the share of max_tokens that recently finished sequences generated. Workloads that always run
to max_tokens (benchmarks with ignore_eos) learn a ratio near 1 and stop overcommitting the cache;
chat requests that stop early learn a small one and keep admitting freely. Until the first finish
there is no reserve: a cold server's first burst of requests, often without max_tokens (so
bounded only by max_model_len), is admitted as it would be without one. A wrong guess costs a
preemption, as it would without the reserve.
`conservativeness` (SGLang's schedule_conservativeness) scales the ratio: 0 turns the reserve off
(admit while the prompt fits), above 1 reserves more than measured.
"""
from collections import deque

from gdserve.engine.request import Sequence

INITIAL_RATIO = 0.0  # before any sequence has finished
WINDOW = 256  # finished sequences the ratio is measured over


class GrowthReserve:
    def __init__(self, conservativeness: float = 1.0, window: int = WINDOW):
        if not conservativeness >= 0:
            raise ValueError(f"schedule_conservativeness must be >= 0, got {conservativeness}")
        self.conservativeness = conservativeness
        self._finished: deque[tuple[int, int]] = deque(maxlen=window)  # (generated, max_tokens)
        self._generated = 0
        self._allowed = 0

    @property
    def ratio(self) -> float:
        """Expected share of a sequence's remaining max_tokens that it will generate."""
        measured = self._generated / self._allowed if self._allowed else INITIAL_RATIO
        return min(1.0, self.conservativeness * measured)

    def record(self, seq: Sequence) -> None:
        """Learn from a sequence that finished by itself (a stop or its length limit)."""
        if len(self._finished) == self._finished.maxlen:
            generated, allowed = self._finished[0]
            self._generated -= generated
            self._allowed -= allowed
        generated, allowed = min(seq.num_output_tokens, seq.max_tokens), seq.max_tokens
        self._finished.append((generated, allowed))
        self._generated += generated
        self._allowed += allowed

    def expected_tokens(self, seq: Sequence, num_slots: int) -> float:
        """Slots seq is still expected to need beyond the num_slots it holds: the rest of its
        known tokens (a prompt prefilled in chunks, or recomputed), and ratio of the outputs it
        may still generate."""
        return _expected(seq, num_slots, self.ratio)

    def reserved_tokens(self, running: list[Sequence], block_size: int) -> float:
        """expected_tokens summed over the running sequences."""
        ratio = self.ratio
        return sum(_expected(seq, len(seq.block_table) * block_size, ratio) for seq in running)


def _expected(seq: Sequence, num_slots: int, ratio: float) -> float:
    num_tokens = len(seq.token_ids)
    remaining = max(0, seq.max_tokens - num_tokens + seq.num_prompt_tokens)  # outputs it may still generate
    return max(0.0, num_tokens + ratio * remaining - num_slots)
