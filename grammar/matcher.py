"""A compiled Grammar (a lazy TokenIndex plus its packed bitmask row per state) and the Matcher
that walks one sequence through it.

Rows are built lazily, once per state, by walking the token trie through the DFA (token_index),
and shared by every Matcher of the Grammar, so a fill is a row copy once a state has been seen.
The caches are not locked: the engine fills and accepts from one thread (concurrent fills can at
worst build a row twice, never a wrong one).
"""
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from gdserve.grammar.allowance import unit_of_work
from gdserve.grammar.bounded_cache import BoundedCache
from gdserve.grammar.forced import forced_bytes
from gdserve.grammar.token_index import UNREACHABLE, TokenIndex, TokenTrie
from gdserve.kernels.bitmask import bitmask_width, pack_words, set_bits

TERMINATED = -1  # the state after EOS
MAX_REACH_SWEEP = 2**24  # table cells x sweeps above which Grammar._reach is not computed (~50 ms)
MAX_CACHED_NEXT_DISTANCES = 16  # states whose tokens' distances a grammar keeps (4 bytes a token)


def _next_distance_cache() -> BoundedCache[int, np.ndarray]:
    return BoundedCache(MAX_CACHED_NEXT_DISTANCES, policy="lru")


@dataclass(frozen=True)
class StateMask:
    row: torch.Tensor   # int32 [W], the packed allowed tokens
    accepting: bool     # EOS allowed
    only_eos: bool      # accepting, and no other token allowed


@dataclass
class Grammar:
    """A compiled constraint; `matcher()` starts a sequence on it. Pickles without its caches
    (compile workers return it that way); the token trie is shared per tokenizer."""
    kind: str
    index: TokenIndex = field(repr=False)
    initial_state: int              # where a matcher starts (after the index's start sentinel)
    vocab_size: int                 # bitmask width in tokens (the model's logits width)
    eos_token_ids: frozenset[int]
    regex: str | None = None        # what the index was built from (regex, choice, json)
    relaxed: list[str] = field(default_factory=list)  # schema keywords relaxed (json, lenient)
    report: dict | None = None      # json: the enforcement report (grammar/json/report.py)
    _masks: dict[int, StateMask] = field(default_factory=dict, init=False, repr=False,
                                         compare=False)
    # (state, token) -> next state, keyed state * 2**32 + token: an int key, unlike a tuple, is no
    # container the garbage collector tracks (tens of thousands per run set off full collections).
    _steps: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _max_next: dict[int, int] = field(default_factory=dict, init=False, repr=False,
                                      compare=False)  # per state: the farthest next state's distance
    _next_distances: BoundedCache[int, np.ndarray] = field(
        default_factory=_next_distance_cache, init=False, repr=False, compare=False)  # see next_distances
    _forced: dict[int, bytes] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict:
        fields = ("kind", "index", "initial_state", "vocab_size", "eos_token_ids", "regex",
                  "relaxed", "report", "max_distance", "_reach")
        return {name: self.__dict__[name] for name in fields if name in self.__dict__}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _masks={}, _steps={}, _max_next={},
                             _next_distances=_next_distance_cache(), _forced={})

    def prepare_budgets(self) -> "Grammar":
        """Compute what the first masks and budget rows read (the states within a token of the
        start, the DFA's distances, max_distance, the reach bound) now, where the grammar
        compiles: they travel with it when pickled, instead of stalling the engine's first step
        that needs them, and a DFA that explodes from its start fails the compile, not the request."""
        self.state_mask(self.initial_state)
        self.max_distance, self._reach  # noqa: B018 (cached properties)
        return self

    def matcher(self) -> "Matcher":
        return Matcher(self)

    @property
    def trie(self) -> TokenTrie:
        return self.index.trie

    def is_final(self, state: int) -> bool:
        return bool(self.index.dfa.final[state])

    def accepts_eos(self, state: int) -> bool:
        """EOS is allowed exactly in accepting states."""
        return self.is_final(state)

    def next_state(self, state: int, token_id: int) -> int | None:
        """The state after a real token (not EOS) from `state`; None if not allowed."""
        key = (state << 32) + token_id
        nxt = self._steps.get(key)
        if nxt is None:
            trie = self.index.trie
            if not 0 <= token_id < min(self.vocab_size, trie.size) or trie.token_node[token_id] < 0:
                return None
            nxt = self._steps[key] = self.index.dfa.walk(state, trie.token_bytes(token_id))
        return None if nxt == self.index.dfa.dead else nxt

    def readable_bytes(self, state: int) -> np.ndarray:
        """bool [256]: the bytes the automaton can read from `state`."""
        dfa = self.index.dfa
        if not dfa.complete:
            dfa.prepare(state, 1)
        return dfa.trans[state][dfa.classes] != dfa.dead

    def advance_bytes(self, state: int, data: bytes) -> int | None:
        """The state after reading `data` from `state`; None where it dies."""
        nxt = self.index.dfa.walk(state, data)
        return None if nxt == self.index.dfa.dead else nxt

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every completion of `state` continues with (grammar.forced), cached per state."""
        forced = self._forced.get(state)
        if forced is None:
            forced = self._forced[state] = forced_bytes(self, state)
        return forced

    def transitions(self, state: int) -> dict[int, int]:
        """{token id: next state} for the real tokens allowed in `state` (tests, tools)."""
        nxt = self.index.next_states(state)[:self.vocab_size]
        allowed = np.flatnonzero(nxt != self.index.dfa.dead)
        return dict(zip(allowed.tolist(), nxt[allowed].tolist()))

    def state_mask(self, state: int) -> StateMask:
        mask = self._masks.get(state)
        if mask is None:
            with unit_of_work():
                mask = self._masks[state] = self._build_mask(state)
        return mask

    def distance(self, state: int) -> int:
        """Bytes on the shortest way from `state` to a complete constraint (0: complete)."""
        return int(self.index.dfa.distance[state])

    @cached_property
    def max_distance(self) -> int:
        """No state's finite distance is larger: budgets at or above it never bind (the
        largest, or a lazy DFA's bound on the states it has not built)."""
        return self.index.dfa.max_distance

    def budget_row(self, state: int, budget: int) -> torch.Tensor:
        """The tokens after which the constraint can still complete within `budget` more tokens
        (bytes bound tokens from above: every byte is a token in byte-level vocabularies), plus
        EOS where complete. Following only these, a sequence completes in time whenever its
        start could; where no token fits, only those that bring completion closest."""
        full = self.state_mask(state).row
        if self._fits(state, budget):
            return full
        dist = self.next_distances(state)
        max_next = self._max_next[state] = int(dist.max())  # -1: no token allowed
        if max_next <= budget or max_next < 0:
            return full
        # Where no token fits the budget in bytes (multi-byte tokens may still make it in
        # tokens), head for completion as fast as the bytes allow.
        accepting = self.is_final(state)
        limit = budget if accepting else max(budget, int(dist.view(np.uint32).min()))  # -1 reads 2**32 - 1
        keep = dist.view(np.uint32) <= limit if limit >= 0 else np.zeros(0, dtype=bool)  # never the not allowed
        return self._with_eos(pack_words(keep, self.vocab_size), accepting)

    def next_distances(self, state: int) -> np.ndarray:
        """int32 [vocab_size]: each real token's distance to completion after it from `state`
        (-1: not allowed; INT32_MAX: allowed, but completion is out of reach). Cached for the
        states most recently used near their budget (least recently used out first): the
        sequences of one schema meet the same few (an unbounded string's) step after step."""
        dist = self._next_distances.lookup(state)
        if dist is None:
            with unit_of_work():
                dist = self._next_distances.put(  # -1 past the tokenizer
                    state, self.index.next_distances(state, self.vocab_size))
        return dist

    def _fits(self, state: int, budget: int) -> bool:
        """Whether every token allowed in `state` keeps completion within `budget`, known
        without walking the state's next states."""
        if budget >= self.max_distance or self._max_next.get(state, UNREACHABLE) <= budget:
            return True
        reach = self._reach
        return reach is not None and reach[state] <= budget

    @cached_property
    def _reach(self) -> np.ndarray | None:
        """int64 [S]: per state, the largest distance of any state within trie.max_depth bytes of
        it (through live states), so no token leads to a state farther from completion: where
        that fits the budget, so does every token. None for a DFA too big to sweep cheaply or
        built on demand (budget_row then walks each state's next states)."""
        dfa, depth = self.index.dfa, self.index.trie.max_depth
        if not dfa.complete or dfa.trans.size * depth > MAX_REACH_SWEEP:
            return None
        succ = np.sort(dfa.trans, axis=1)  # each state's distinct successors, once each
        first = np.ones(succ.shape, dtype=bool)
        first[:, 1:] = succ[:, 1:] != succ[:, :-1]
        starts = np.concatenate([[0], np.cumsum(first.sum(axis=1))[:-1]])
        succ = succ[first]
        reach = dfa.distance.copy()
        reach[dfa.dead] = 0  # a dead byte leads nowhere: it must not raise the maximum
        for _ in range(depth):
            wider = np.maximum(reach, np.maximum.reduceat(reach[succ], starts))
            wider[dfa.dead] = 0
            if np.array_equal(wider, reach):
                break
            reach = wider
        return reach

    @cached_property
    def eos_row(self) -> torch.Tensor:
        """Only EOS allowed: what a terminated matcher fills (the row is never all-disallowed)."""
        return self._with_eos(np.zeros(bitmask_width(self.vocab_size), dtype=np.uint32), True)

    def _build_mask(self, state: int) -> StateMask:
        accepting = self.is_final(state)
        words, count = self.index.allowed_words(state, self.vocab_size)
        return StateMask(self._with_eos(words, accepting), accepting,
                         only_eos=accepting and count == 0)

    @cached_property
    def _eos_array(self) -> np.ndarray:
        return np.array(sorted(i for i in self.eos_token_ids if i < self.vocab_size),
                        dtype=np.int64)

    def _with_eos(self, words: np.ndarray, eos: bool) -> torch.Tensor:
        # EOS ids hold no bytes in the trie, so their bits are still clear here.
        if eos and len(self._eos_array):
            set_bits(words, self._eos_array)
        return torch.from_numpy(words.view(np.int32))


def write_row(bitmask: torch.Tensor, row: int, words: torch.Tensor, vocab_size: int) -> None:
    """Copy one packed mask row into bitmask[row], checking the widths agree."""
    _check_width(bitmask, words, vocab_size)
    bitmask[row].copy_(words)


def stack_rows(bitmask: torch.Tensor, rows: list[torch.Tensor], vocab_size: int) -> None:
    """bitmask[i] = rows[i] for every row, in one copy (rows from Matcher.next_token_row; bitmask
    on the CPU). numpy's, not torch.stack: torch splits a copy this size over its thread pool,
    whose threads then spin on every core and slow the step's single-threaded host work."""
    _check_width(bitmask, rows[0], vocab_size)
    np.concatenate([row.numpy() for row in rows], out=bitmask.numpy().reshape(-1))


def _check_width(bitmask: torch.Tensor, words: torch.Tensor, vocab_size: int) -> None:
    if bitmask.shape[-1] != words.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[-1]} words per row; this grammar's "
                         f"vocab_size {vocab_size} needs {words.shape[0]}")


class StateWalk:
    """One sequence's walk through a grammar: `_states` holds the initial state, then the state
    after each accepted token (`terminated` after EOS), so rollback is a pop. The grammar gives
    state_mask(state) (.row, .only_eos), budget_row(state, budget), eos_row, vocab_size,
    eos_token_ids, accepts_eos(state) and next_state(state, token_id); a subclass gives
    distance_to_complete, and may watch each step (_stepped)."""
    terminated: object

    def __init__(self, grammar, initial_state):
        self.grammar = grammar
        self._states = [initial_state]

    @property
    def state(self):
        return self._states[-1]

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int = 0,
                                budget: int | None = None) -> None:
        """Write the allowed next tokens into bitmask[row] (int32 [B, ceil(vocab_size / 32)]).
        budget: the tokens the sequence may still emit after this one; near it, only tokens that
        keep the constraint completable within it (the grammar's budget_row: exact for a regex,
        checked token by token near the end for a context-free grammar, cfg.budget)."""
        write_row(bitmask, row, self.next_token_row(budget), self.grammar.vocab_size)

    def next_token_row(self, budget: int | None = None) -> torch.Tensor:
        """The packed row fill_next_token_bitmask writes (int32 [ceil(vocab_size / 32)], shared:
        read, never modify), for callers that stack many rows at once."""
        state = self._states[-1]
        if state == self.terminated:
            return self.grammar.eos_row
        if budget is not None:
            return self.grammar.budget_row(state, budget)
        return self.grammar.state_mask(state).row

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the token is not allowed here."""
        state = self._states[-1]
        if state == self.terminated:
            return False
        if token_id in self.grammar.eos_token_ids:
            nxt = self.terminated if self.grammar.accepts_eos(state) else None
        else:
            nxt = self.grammar.next_state(state, token_id)
        if nxt is None:
            return False
        self._stepped(state, nxt, token_id)
        self._states.append(nxt)
        return True

    def _stepped(self, state, nxt, token_id: int) -> None:
        """Called as a token takes `state` to `nxt`, before it is recorded."""

    def is_terminated(self) -> bool:
        """EOS accepted, or the constraint is complete and only EOS can follow."""
        state = self._states[-1]
        if state == self.terminated:
            return True
        # Only an accepting state needs its row (built on a first visit) to tell.
        return self.grammar.accepts_eos(state) and self.grammar.state_mask(state).only_eos

    def forced_bytes(self) -> bytes:
        """The text every completion from here continues with (grammar/forced.py): empty where
        the next byte is the model's to choose or the constraint may end here."""
        state = self._states[-1]
        return b"" if state == self.terminated else self.grammar.forced_bytes(state)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens (EOS included)."""
        if not 0 <= num_tokens < len(self._states):
            raise ValueError(f"cannot roll back {num_tokens} tokens: "
                             f"{len(self._states) - 1} accepted")
        if num_tokens:
            del self._states[-num_tokens:]


class Matcher(StateWalk):
    """A sequence's walk through a (regex) Grammar."""
    terminated = TERMINATED

    def __init__(self, grammar: Grammar):
        super().__init__(grammar, grammar.initial_state)

    def distance_to_complete(self) -> int:
        """Bytes still needed, at the fewest, to complete the constraint: an upper bound on the
        tokens needed when every byte is a token (byte-level BPE, SentencePiece byte fallback)."""
        state = self._states[-1]
        return 0 if state == TERMINATED else self.grammar.distance(state)
