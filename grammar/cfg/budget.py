"""Closing a context-free grammar's text before max_tokens: near its budget a row keeps only the
tokens after which a completion of the constraint is known to fit in the tokens left
(CfgGrammar.budget_row), as the regex path does with its DFA's distances.

A token's completion is the length in bytes of a known completion of the state it leads to
(cfg.complete's search, cached per state); a byte is a token at worst, so bytes bound tokens from
above. Two kinds of token are checked, both cheaply: those that start the state's own shortest
completion (they inherit its rest, no search), and those that stay inside the current lexeme with
no lexeme ending inside them (a string's body: most of the vocabulary), grouped by the lexer state
they lead to: one lexer walk and a search per distinct lexer state. The tokens that end a lexeme
otherwise (thousands, each a parser step to read) are left out near the budget: refusing a token
never makes an output invalid, and following only checked tokens, a sequence completes in time.
"""
import numpy as np

from gdserve.grammar.cfg.complete import prefix_tokens
from gdserve.kernels.bitmask import unpack_words

UNKNOWN = np.iinfo(np.int32).max  # allowed, but no completion is known after it


def next_completions(grammar, state, budget: int) -> np.ndarray:
    """int32 [vocab_size]: for each checked token (module docstring), the bytes of a completion
    after it (UNKNOWN where none of at most `budget` bytes was found); -1 for every other token."""
    out = np.full(grammar.vocab_size, -1, dtype=np.int32)
    if len(state) == 1:
        (config,) = state
        allowed = unpack_words(grammar.words(config), grammar.vocab_size)
        grouped, ends = _inside_tokens(grammar, config, allowed)
        for lex in np.unique(ends[grouped]).tolist():
            ids = np.flatnonzero(grouped & (ends == lex))
            succ = frozenset(grammar.settled(config.stack, lex))
            path = (grammar.completion_within(succ, max(budget, 0)) or grammar.known_completion(succ)) if succ else None
            out[ids] = UNKNOWN if path is None else len(path)
    own = grammar.known_completion(state)
    if own:
        for token_id in prefix_tokens(grammar, own).tolist():
            rest = len(own) - len(grammar.token_data(token_id))
            out[token_id] = min(int(out[token_id]) if out[token_id] >= 0 else UNKNOWN, rest)
    return out


def _inside_tokens(grammar, config, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bool [V] the allowed tokens that stay inside config's lexeme with no lexeme ending within
    them, int32 [V] each token's lexer state after its bytes)."""
    ends = grammar.lexer_next_states(config.lex)[:grammar.vocab_size]
    n = len(ends)
    grouped = np.zeros(grammar.vocab_size, dtype=bool)
    if grammar.spec.exact and grammar.lexer.emits(config.lex):
        return grouped, ends  # the pending lexeme may end before any token's first byte
    grouped[:n] = allowed[:n] & (ends != grammar.lexer.arrays()[0].dead)
    exp = grammar.root(config.lex)
    for crossing in exp.crossings.values():
        grouped[_subtree_tokens(grammar, crossing.roots)] = False
    return grouped, ends


def _subtree_tokens(grammar, roots: np.ndarray) -> np.ndarray:
    """Token ids (below vocab_size) through any of the trie nodes `roots` (their subtrees)."""
    t = grammar.trie
    sizes = t.skip[roots] - roots
    nodes = np.repeat(roots - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
    lo, counts = t.tok_ptr[nodes], t.tok_ptr[nodes + 1] - t.tok_ptr[nodes]
    ids = t.tok_ids[np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())]
    return ids[ids < grammar.vocab_size]
