"""The token mask store of a context-free grammar: per (lexer, lexer state), which tokens stay
inside the current lexeme and which end it and go on into the next one; independent of the parser.

A token is read byte by byte from the lexer state. Walking the token trie through the lexer DFA
(token_index's C walk) splits the vocabulary at once into:
- inside: every byte keeps the lexeme alive (allowed whatever the parser stack);
- crossing: the trie node where the lexeme dies has a parent in an accepting state, so the
  lexeme's terminal T is emitted there and the token's rest starts a new lexeme: the node's whole
  subtree (every token through it) continues from the next lexer's start. Grouped by T.
- the rest: a byte kills a lexeme that is not complete. Never allowed.
A lexer state that is itself accepting makes every token whose first byte it cannot take a
crossing at depth 0: those are `dying_first` (tokens by first byte), and at run time they are the
next lexeme's start mask ANDed with it.
When lexemes may end at any complete match (`split`, cfg.lexer), every node below an accepting
state is a crossing, alive or not, and at depth 0 every token may start the next lexeme.
Crossing subtrees are walked the same way from the next lexer's start (an Expansion per
(crossing group, next lexer start)), which finds nested crossings (`"},{"`). Only the parser steps
depend on the stack; the matcher applies them (cfg.grammar.CfgGrammar.mask).
"""
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from gdserve.grammar.token_index import ByteDFA, TokenIndex, TokenTrie, mask_library
from gdserve.kernels.bitmask import bitmask_width, set_bits


@dataclass(eq=False)
class Crossing:
    roots: np.ndarray                                   # int32 trie nodes where a lexeme starts
    children: dict = field(default_factory=dict)        # next lexer start -> Expansion of the roots' subtrees


@dataclass(eq=False)
class Expansion:
    inside: np.ndarray                                  # uint32 [W]: tokens that stay inside
    crossings: dict[int, Crossing]                      # accept id (Lexer.emits) -> where lexemes start
    dying_first: np.ndarray | None = None               # uint32 [W] (root level, accepting state)

    def relabeled(self, accept_id: int) -> "Expansion":
        """The expansion of a state that reads bytes as this one does but completes `accept_id`
        (one crossing group at most: a state where one terminal is alive), sharing the walks."""
        assert len(self.crossings) <= 1
        return Expansion(self.inside, {accept_id: c for c in self.crossings.values()}, self.dying_first)


@dataclass(eq=False)
class MaskStore:
    trie: TokenTrie
    vocab_size: int
    split: bool = False
    _last_index: TokenIndex | None = field(default=None, repr=False)

    @property
    def width(self) -> int:
        return bitmask_width(self.vocab_size)

    @cached_property
    def _first_byte_words(self) -> np.ndarray:
        return self.trie.first_byte_words(self.vocab_size)

    def root(self, dfa: ByteDFA, accept: np.ndarray, state: int) -> Expansion:
        """The whole vocabulary read from `state` (one trie walk)."""
        words, nodes, terms = self._index(dfa).crossings_walk(state, self.vocab_size, accept, self.split)
        exp = Expansion(words, _by_terminal(nodes, terms))
        if accept[state] >= 0 and not self.split:
            exp.dying_first = self._first_bytes_union(dfa.trans[state, dfa.classes] == dfa.dead)
        return exp

    @cached_property
    def _all_first_words(self) -> np.ndarray:
        return np.bitwise_or.reduce(self._first_byte_words, axis=0)

    def _first_bytes_union(self, first: np.ndarray) -> np.ndarray:
        """uint32 [W]: the tokens whose first byte is in `first` (bool [256]); through the bytes
        not in it when they are fewer (first bytes partition the tokens)."""
        if first.sum() <= 128:
            return np.bitwise_or.reduce(self._first_byte_words[first], axis=0, initial=np.uint32(0))
        return self._all_first_words & ~np.bitwise_or.reduce(self._first_byte_words[~first], axis=0,
                                                             initial=np.uint32(0))

    def next_states(self, dfa: ByteDFA, accept: np.ndarray, state: int) -> np.ndarray:
        """int32 [trie size]: each token's state after its bytes from `state` (dfa.dead where
        the lexeme dies within it)."""
        return self._index(dfa).next_states(state)

    def _index(self, dfa: ByteDFA) -> TokenIndex:
        """The token index of the lexer's current DFA (kept while the lexer does not grow)."""
        if self._last_index is None or self._last_index.dfa is not dfa:
            self._last_index = TokenIndex(dfa, self.trie)
        return self._last_index

    def subtrees(self, dfa: ByteDFA, accept: np.ndarray, start: int,
                  roots: np.ndarray) -> Expansion:
        """The tokens through `roots` read from `start`, each root's byte first: the subtrees'
        nodes walked level by level (numpy, where the native walk is missing)."""
        lib = mask_library()
        if lib is not None:
            words, nodes, terms = self._index(dfa).subtrees_walk(lib, start, roots, self.vocab_size, accept,
                                                                 self.split)
            return Expansion(words, _by_terminal(nodes, terms))
        t = self.trie
        sizes = t.skip[roots] - roots
        offsets = np.cumsum(sizes) - sizes               # where each subtree starts in `nodes`
        shift = np.repeat(offsets - roots, sizes)        # node id -> position in `nodes`
        nodes = np.arange(sizes.sum()) - shift
        rel = t.depth[nodes] - np.repeat(t.depth[roots], sizes)
        local_parent = t.parent[nodes] + shift           # meaningless at the roots (rel 0)
        cls = dfa.classes[t.byte[nodes]]
        state = np.full(len(nodes), dfa.dead, dtype=np.int32)
        for level in range(int(rel.max()) + 1 if len(nodes) else 0):
            at = np.flatnonzero(rel == level)
            prev = start if level == 0 else state[local_parent[at]]
            state[at] = dfa.trans[prev, cls[at]]
            if not (state[at] != dfa.dead).any():
                break
        alive = state != dfa.dead
        words = np.zeros(self.width, dtype=np.uint32)
        set_bits(words, self._tokens_at(nodes[alive]))
        ends = np.flatnonzero((rel > 0) & (self.split | ~alive))
        prev = state[local_parent[ends]]
        emitted = np.where(prev != dfa.dead, accept[prev], -1)
        keep = emitted >= 0
        ends, emitted = nodes[ends[keep]].astype(np.int32), emitted[keep]
        return Expansion(words, _by_terminal(ends, emitted))

    def _tokens_at(self, nodes: np.ndarray) -> np.ndarray:
        """The token ids (below vocab_size) that end at `nodes`."""
        t = self.trie
        lo, hi = t.tok_ptr[nodes], t.tok_ptr[nodes + 1]
        counts = hi - lo
        ids = t.tok_ids[np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())]
        return ids[ids < self.vocab_size]


def _by_terminal(nodes: np.ndarray, terms: np.ndarray) -> dict[int, Crossing]:
    """Crossing nodes grouped by the terminal emitted there."""
    return {int(term): Crossing(nodes[terms == term]) for term in np.unique(terms)}

