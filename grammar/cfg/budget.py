"""Closing a context-free grammar's text before max_tokens: near its budget a row keeps only the
tokens after which a completion of the constraint is known to fit in the tokens left
(CfgGrammar.budget_row), as the regex path does with its DFA's distances.

A token's completion is a known completion of the state it leads to (cfg.complete's search,
cached per state), counted in the tokens of its greedy tokenization: the masks allow each of them
in turn (a mask allows every token whose bytes the grammar accepts), so they bound the tokens
that completion takes from above (in a BPE vocabulary well under its bytes). Two kinds of token are checked, both cheaply: those that start the state's own shortest
completion (they inherit its rest, no search), and those that stay inside the current lexeme with
no lexeme ending inside them (a string's body: most of the vocabulary), grouped by the lexer state
they lead to (InsideGroups, per lexer state: the stack does not change them): one search per
group. The tokens that end a lexeme otherwise (thousands, each a parser step to read) are left out
near the budget: refusing a token never makes an output invalid, and following only checked
tokens, a sequence completes in time.

A state's checked tokens (NextCompletions) make one row per set of groups that fit: the rows
differ only where the budget crosses a group's completion tokens, so a row is built once per
length crossed, then looked up.
"""
import bisect
from dataclasses import dataclass, field

import numpy as np
import torch

from gdserve.grammar.cfg.complete import prefix_tokens
from gdserve.kernels.bitmask import empty_words, set_bits

UNKNOWN = np.iinfo(np.int32).max  # allowed, but no completion is known after it
NO_GROUPS = np.zeros((0, 0), dtype=np.uint32)
ONE_HOT_GROUPS = 64  # inside groups up to this many are packed from a table of bools (faster)


@dataclass(frozen=True, eq=False)
class InsideGroups:
    """From one lexer state: the tokens that stay inside its lexeme with no lexeme ending within
    them, grouped by the lexer state they lead to."""
    ends: list[int]       # each group's lexer state after its tokens
    words: np.ndarray     # uint32 [G, W]: each group's tokens, packed


def inside_groups(grammar, lex: int) -> InsideGroups:
    """The lexer state's InsideGroups (none where, exact, the pending lexeme may end before any
    token's first byte)."""
    if grammar.spec.exact and grammar.lexer.emits(lex):
        return InsideGroups([], NO_GROUPS)
    dfa, accept = grammar.lexer.arrays()
    exp = grammar.root(lex)
    ends = grammar.store.next_states(dfa, accept, lex)[:grammar.vocab_size]
    grouped = np.unpackbits(exp.inside.view(np.uint8), bitorder="little")[:len(ends)].astype(bool)
    grouped &= ends != dfa.dead
    for crossing in exp.crossings.values():
        grouped[_subtree_tokens(grammar, crossing.roots)] = False
    ids = np.flatnonzero(grouped)
    if not len(ids):
        return InsideGroups([], NO_GROUPS)
    keys = ends[ids]
    present = np.zeros(int(keys.max()) + 1, dtype=bool)
    present[keys] = True
    distinct = np.flatnonzero(present)  # the lexer states the groups lead to, ascending
    group = np.zeros(len(present), dtype=np.int64)
    group[distinct] = np.arange(len(distinct))
    if len(distinct) <= ONE_HOT_GROUPS:
        members = np.zeros((len(distinct), 32 * len(exp.inside)), dtype=bool)
        members[group[keys], ids] = True
        words = np.packbits(members, axis=1, bitorder="little").view(np.uint32)
    else:  # a table of bools per group would take too much memory
        words = np.zeros((len(distinct), len(exp.inside)), dtype=np.uint32)
        np.bitwise_or.at(words, (group[keys], ids >> 5), np.left_shift(1, ids & 31).astype(np.uint32))
    return InsideGroups(distinct.tolist(), words)


def _subtree_tokens(grammar, roots: np.ndarray) -> np.ndarray:
    """Token ids (below vocab_size) through any of the trie nodes `roots` (their subtrees)."""
    t = grammar.trie
    sizes = t.skip[roots] - roots
    nodes = np.repeat(roots - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
    lo, counts = t.tok_ptr[nodes], t.tok_ptr[nodes + 1] - t.tok_ptr[nodes]
    ids = t.tok_ids[np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())]
    return ids[ids < grammar.vocab_size]


def next_completions(grammar, state, budget: int) -> "NextCompletions":
    """The state's checked tokens and their completions, searched within `budget` bytes."""
    group_words, group_lens = NO_GROUPS, []
    if len(state) == 1:
        (config,) = state
        groups = grammar.inside_groups(config.lex)
        group_words = groups.words
        for lex in groups.ends:
            path = _group_completion(grammar, config.stack, lex, budget)
            group_lens.append(UNKNOWN if path is None else grammar.text_tokens(path))
    own = grammar.known_completion(state)
    prefix_ids = prefix_tokens(grammar, own) if own else np.zeros(0, dtype=np.int64)
    prefix_lens = np.array([grammar.text_tokens(own[len(grammar.token_data(t)):]) for t in prefix_ids.tolist()],
                           dtype=np.int64)
    accepting = grammar.state_mask(state).accepting
    return NextCompletions(budget, grammar.vocab_size, group_words, group_lens, prefix_ids, prefix_lens,
                           grammar.eos_ids if accepting else None)


def _group_completion(grammar, stack, lex: int, budget: int) -> bytes | None:
    """A known completion of the state a group leads to (its stack, lexer state `lex`): the one
    found before; else the lexeme's shortest end and a completion of the state that end leads to
    (a group's lexeme ends alike whatever the group: inside a string, after its closing quote,
    so one search serves every group of a state, and every state of that string); else a search
    from the group's own state. Each is text the matcher reads, checked by advance."""
    succ = frozenset(grammar.settled(stack, lex))
    if not succ:
        return None
    known = grammar.known_completion(succ)
    if known is not None:
        return known
    config = next(iter(succ))
    open_lexeme = len(succ) == 1 and config.lex == lex and config.stack is stack  # not emitted by settled
    end = grammar.lexer.shortest_end(lex) if open_lexeme else None
    after = grammar.advance(succ, end) if end else None
    if after is not None:
        rest = grammar.completion_within(after, max(budget - len(end), 0)) or grammar.known_completion(after)
        if rest is not None:
            grammar.inherit_completion(succ, end + rest)
            return end + rest
    return grammar.completion_within(succ, max(budget, 0)) or grammar.known_completion(succ)


@dataclass(eq=False)
class NextCompletions:
    """A state's checked tokens (module docstring) and the tokens of a known completion after
    each, found by searches bounded by `searched` bytes (UNKNOWN where none was found within it:
    the answers hold for every smaller budget)."""
    searched: int
    vocab_size: int
    group_words: np.ndarray     # uint32 [G, W]
    group_lens: list[int]       # per group, in tokens
    prefix_ids: np.ndarray      # int64: the tokens that start the state's own completion
    prefix_lens: np.ndarray     # int64: the rest of it after each, in tokens
    eos_ids: np.ndarray | None  # set in every row: the state accepts EOS
    lengths: list[int] = field(init=False)  # the distinct known completion lengths, shortest first
    _rows: dict[int, torch.Tensor] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        known = {n for n in self.group_lens if n < UNKNOWN} | set(self.prefix_lens.tolist())
        self.lengths = sorted(known)

    def row(self, limit: int) -> torch.Tensor:
        """int32 [W]: the checked tokens whose completion takes at most `limit` tokens, and EOS
        where the state accepts it. Shared: read, never modify."""
        key = bisect.bisect_right(self.lengths, limit)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = self._build_row(self.lengths[key - 1] if key else -1)
        return row

    def _build_row(self, limit: int) -> torch.Tensor:
        fit = [g for g, n in enumerate(self.group_lens) if n <= limit]
        words = np.bitwise_or.reduce(self.group_words[fit], axis=0) if fit else empty_words(self.vocab_size)
        set_bits(words, self.prefix_ids[self.prefix_lens <= limit])
        if self.eos_ids is not None:
            set_bits(words, self.eos_ids)
        return torch.from_numpy(words.view(np.int32))
