"""Forced text: the bytes that every completion of a matcher's state continues with (empty
where the next byte is the model's to choose, or where the constraint may end here). Read off
the automaton byte by byte: while EOS is not allowed and exactly one byte can be read next, that
byte is forced. A grammar gives `readable_bytes(state)` (bool [256], a superset of the bytes it
can read: a byte outside it never is), `advance_bytes(state, data)` (None where refused) and
`accepts_eos(state)`; a superset only makes the text shorter, never wrong, since the one byte
left is read before it is taken.

forced_tokens turns a matcher's forced text into the tokens to append for it.
"""
from collections.abc import Callable

import numpy as np

from gdserve.kernels.bitmask import unpack_words

MAX_FORCED_BYTES = 256  # per call: a longer forced text is taken in pieces


def forced_bytes(grammar, state) -> bytes:
    out = bytearray()
    while len(out) < MAX_FORCED_BYTES and not grammar.accepts_eos(state):
        readable = np.flatnonzero(grammar.readable_bytes(state))
        if len(readable) != 1:
            break
        nxt = grammar.advance_bytes(state, bytes((int(readable[0]),)))
        if nxt is None:
            break
        out.append(int(readable[0]))
        state = nxt
    return bytes(out)


def forced_tokens(matcher, encode: Callable[[str], list[int]] | None = None) -> list[int]:
    """The tokens that spell the matcher's forced text, for appending without a decode step each:
    the tokenizer's own tokenization of it (`encode`, how the model saw such text in training)
    where that spells it exactly, else the greedy one over the vocabulary; less the last token
    where the matcher also allows a longer token starting with its bytes (the model may take a
    token across the end of the forced text: that seam stays the model's). Each token is one the
    matcher accepts in turn; the matcher is left where it was. Empty where nothing is forced."""
    data = matcher.forced_bytes()
    if not data:
        return []
    grammar = matcher.grammar
    trie, vocab_size = grammar.trie, grammar.vocab_size
    tokens = _spelled(data, encode, trie, vocab_size)
    accepted = 0
    try:
        for token in tokens[:-1]:
            if not matcher.accept_token(token):
                return tokens[:accepted]
            accepted += 1
        last = tokens[-1]
        if _extended(matcher.next_token_row(), trie, last, vocab_size) or not matcher.accept_token(last):
            return tokens[:accepted]
        accepted += 1
        return tokens
    finally:
        matcher.rollback(accepted)


def _spelled(data: bytes, encode, trie, vocab_size: int) -> list[int]:
    if encode is not None:
        try:
            tokens = encode(data.decode("utf-8"))
        except UnicodeDecodeError:  # the forced text ends inside a character
            tokens = None
        if tokens and all(0 <= t < vocab_size for t in tokens) and \
                b"".join(trie.token_bytes(t) for t in tokens) == data:
            return tokens
    return trie.greedy_tokens(data, vocab_size) or []


def _extended(row, trie, token: int, vocab_size: int) -> bool:
    """Whether `row` (the packed allowed tokens) allows a token whose bytes start with `token`'s
    and go on: the tokens below its node in the preorder trie."""
    node = int(trie.token_node[token])
    below = trie.tok_ids[trie.tok_ptr[node + 1]:trie.tok_ptr[int(trie.skip[node])]]
    below = below[below < vocab_size]
    if not len(below):
        return False
    allowed = unpack_words(row.numpy().view(np.uint32), vocab_size)
    return bool(allowed[below].any())
