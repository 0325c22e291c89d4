"""Closing a context-free grammar's text before max_tokens: each allowed token's completion after
it, so that near its budget a row keeps only the tokens after which the constraint can still be
completed in time (CfgGrammar.budget_row), as the regex path does with its DFA's distances.

A token's completion is the length in bytes of a known completion of the state it leads to
(cfg_complete's search, cached per state); a byte is a token at worst, so bytes bound tokens from
above. Tokens that start the current state's own completion inherit its rest without a search.
Tokens are grouped by the state they lead to, so a string's body (most of the vocabulary) costs
one lexer walk and a search per distinct lexer state, not a step per token: a token that stays
inside the current lexeme, with no lexeme ending inside it, leads from (stack, lexer state) to
(stack, the lexer state after its bytes). The other tokens (those that end a lexeme) are read
one by one.
"""
from collections import defaultdict

import numpy as np

from gdserve.grammar.cfg_complete import prefix_tokens
from gdserve.kernels.bitmask import unpack_words

UNKNOWN = np.iinfo(np.int32).max  # allowed, but no completion is known after it
MAX_READ = 2048  # tokens a state may need read one by one (the rest: CfgGrammar steers instead)


def next_completions(grammar, state, budget: int) -> np.ndarray | None:
    """int32 [vocab_size]: for each real token allowed in `state`, the bytes of a completion
    after it; -1 where not allowed, UNKNOWN where none of at most `budget` bytes was found (or,
    for the tokens that start the state's own completion, any known). None where more than
    MAX_READ tokens would be read one by one (lexemes that end inside many tokens: a Lark
    grammar's space-led words)."""
    groups = _successors(grammar, state)
    if groups is None:
        return None
    out = np.full(grammar.vocab_size, -1, dtype=np.int32)
    _inherit(grammar, state, groups)
    for succ, ids in groups.items():
        path = grammar.completion_within(succ, max(budget, 0)) or grammar.known_completion(succ)
        out[ids] = UNKNOWN if path is None else len(path)
    return out


def _successors(grammar, state) -> dict | None:
    """{next state: int64 token ids leading to it} over the real tokens allowed in `state`; None
    past MAX_READ tokens to read one by one."""
    allowed = np.zeros(grammar.vocab_size, dtype=bool)
    for config in state:
        allowed |= unpack_words(grammar.words(config), grammar.vocab_size)
    groups: dict = defaultdict(list)
    rest = allowed
    if len(state) == 1:
        (config,) = state
        grouped, ends = _inside_tokens(grammar, config, allowed)
        for lex in np.unique(ends[grouped]).tolist():
            ids = np.flatnonzero(grouped & (ends == lex))
            groups[frozenset(grammar.settled(config.stack, lex))].append(ids)
        rest = allowed & ~grouped
    if rest.sum() > MAX_READ:
        return None
    for token_id in np.flatnonzero(rest).tolist():
        succ = grammar.advance(state, grammar.token_data(token_id))
        if succ is not None:
            groups[succ].append(np.array([token_id]))
    return {succ: np.concatenate(ids) for succ, ids in groups.items()}


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


def _inherit(grammar, state, groups: dict) -> None:
    """The successors through a token that starts `state`'s known completion take its rest as
    theirs (no search)."""
    path = grammar.completion(state)
    if not path:
        return
    starts = set(prefix_tokens(grammar, path).tolist())
    for succ, ids in groups.items():
        for token_id in ids.tolist():
            if token_id in starts:
                grammar.inherit_completion(succ, path[len(grammar.token_data(token_id)):])
                break
