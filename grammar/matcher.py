"""A compiled Grammar (an outlines-core token index plus its packed bitmask row per state) and the
Matcher that walks one sequence through it.

Rows are built lazily, once per state, from `index.get_allowed_tokens(state)` and shared by every
Matcher of the Grammar, so a fill is a row copy. The cache is not locked: the engine fills and
accepts from one thread (concurrent fills can at worst build a row twice, never a wrong one).
"""
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from outlines_core import Index

from gdserve.kernels.bitmask import bitmask_width

TERMINATED = -1  # the state after EOS; outlines-core states are unsigned


@dataclass(frozen=True)
class StateMask:
    row: torch.Tensor   # int32 [W], the packed allowed tokens
    accepting: bool     # EOS allowed
    only_eos: bool      # accepting, and no other token allowed


@dataclass
class Grammar:
    """A compiled constraint; `matcher()` starts a sequence on it. Pickles (the Index through its
    binary form), which is how compile workers return it; the row cache stays per process."""
    kind: str
    index: Index = field(repr=False)
    initial_state: int              # where a matcher starts (after the index's start token)
    vocab_size: int                 # bitmask width in tokens (the model's logits width)
    eos_token_ids: frozenset[int]
    regex: str | None = None        # what the index was built from (regex, choice, json)
    relaxed: list[str] = field(default_factory=list)  # schema keywords relaxed (json, lenient)
    _masks: dict[int, StateMask] = field(default_factory=dict, init=False, repr=False,
                                         compare=False)

    def matcher(self) -> "Matcher":
        return Matcher(self)

    def state_mask(self, state: int) -> StateMask:
        mask = self._masks.get(state)
        if mask is None:
            mask = self._masks[state] = self._build_mask(state)
        return mask

    @cached_property
    def eos_row(self) -> torch.Tensor:
        """Only EOS allowed: what a terminated matcher fills (the row is never all-disallowed)."""
        return self._pack([], eos=True)

    def _build_mask(self, state: int) -> StateMask:
        accepting = self.index.is_final_state(state)
        allowed = np.fromiter(self.index.get_allowed_tokens(state), dtype=np.int64)
        # outlines-core lists its one EOS id in accepting states; _pack sets all of ours instead.
        allowed = allowed[(allowed < self.vocab_size) & ~np.isin(allowed, self._eos_array)]
        return StateMask(self._pack(allowed, eos=accepting), accepting,
                         only_eos=accepting and allowed.size == 0)

    @cached_property
    def _eos_array(self) -> np.ndarray:
        return np.array(sorted(self.eos_token_ids), dtype=np.int64)

    def _pack(self, token_ids, eos: bool) -> torch.Tensor:
        bits = np.zeros(bitmask_width(self.vocab_size) * 32, dtype=bool)
        bits[np.asarray(token_ids, dtype=np.int64)] = True
        bits[self._eos_array] = eos
        # Little bit order in bytes, little-endian words: token i is bit i % 32 of word i // 32.
        words = np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)
        return torch.from_numpy(words)


class Matcher:
    """One sequence's walk through a Grammar. `_states` holds the initial state, then the state
    after each accepted token (TERMINATED after EOS), so rollback is a pop."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self._states = [grammar.initial_state]

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the token is not allowed here."""
        state = self._states[-1]
        if state == TERMINATED:
            return False
        if token_id in self.grammar.eos_token_ids:
            next_state = TERMINATED if self.grammar.index.is_final_state(state) else None
        elif 0 <= token_id < self.grammar.vocab_size:
            next_state = self.grammar.index.get_next_state(state, token_id)
        else:
            next_state = None
        if next_state is None:
            return False
        self._states.append(next_state)
        return True

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the allowed next tokens into bitmask[row] (int32 [B, ceil(vocab_size / 32)])."""
        state = self._states[-1]
        words = self.grammar.eos_row if state == TERMINATED else self.grammar.state_mask(state).row
        if bitmask.shape[-1] != words.shape[0]:
            raise ValueError(f"bitmask has {bitmask.shape[-1]} words per row; this grammar's "
                             f"vocab_size {self.grammar.vocab_size} needs {words.shape[0]}")
        bitmask[row].copy_(words)

    def is_terminated(self) -> bool:
        """EOS accepted, or the constraint is complete and only EOS can follow."""
        state = self._states[-1]
        return state == TERMINATED or self.grammar.state_mask(state).only_eos

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens (EOS included)."""
        if not 0 <= num_tokens < len(self._states):
            raise ValueError(f"cannot roll back {num_tokens} tokens: "
                             f"{len(self._states) - 1} accepted")
        if num_tokens:
            del self._states[-num_tokens:]
