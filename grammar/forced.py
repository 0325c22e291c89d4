"""Forced text: the bytes that every completion of a matcher's state continues with (empty
where the next byte is the model's to choose, or where the constraint may end here). Read off
the automaton byte by byte: while EOS is not allowed and exactly one byte can be read next, that
byte is forced. A grammar gives `readable_bytes(state)` (bool [256], a superset of the bytes it
can read: a byte outside it never is), `advance_bytes(state, data)` (None where refused) and
`accepts_eos(state)`; a superset only makes the text shorter, never wrong, since the one byte
left is read before it is taken.

take_forced_tokens turns a matcher's forced text into the tokens to append for it, and moves the
matcher past them: the decode loop appends them without a decode step each (the next step
prefills them as a chunk).
"""
from collections.abc import Callable

import numpy as np


MAX_FORCED_BYTES = 256  # per call: a longer forced text is taken in pieces
MAX_SEAM_CHECKS = 64    # longer tokens walked at the end of a forced text; past them it stays open


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


class TextEncoder:
    """A tokenizer's own encoding of text (no special tokens), picklable to mask workers."""

    def __init__(self, backend):
        self.backend = backend  # a `tokenizers.Tokenizer`

    def __call__(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids


def text_encoder(tokenizer) -> TextEncoder | None:
    """The encoder of a fast (Rust-backed) Hugging Face tokenizer; None for others (forced text
    is then spelled greedily over the vocabulary)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return TextEncoder(backend) if backend is not None else None


def take_forced_tokens(matcher, encode: Callable[[str], list[int]] | None = None, context: bytes = b"",
                       limit: int = MAX_FORCED_BYTES) -> list[int]:
    """The tokens that spell the matcher's forced text, at most `limit`, accepted by the matcher
    (left after them). Spelled as the model saw such text in training: the tokenizer's own
    tokenization (`encode`) of `context` (the bytes of the tokens just before, the model's
    choice, never rewritten) followed by the forced text, from the token boundary at the end of
    `context`; where its tokens cross that boundary, of the forced text alone; where neither
    spells it exactly, the greedy one over the vocabulary. The end seam stays the model's: the
    last token is left out where the matcher also allows a longer token starting with its bytes
    (the model may take a token across the end of the forced text). Empty where nothing is
    forced."""
    data = matcher.forced_bytes()
    if not data or limit < 1:
        return []
    grammar = matcher.grammar
    trie, vocab_size = grammar.trie, grammar.vocab_size
    tokens = _spelled(data, context, encode, trie, vocab_size)[:limit]
    accepted = 0
    for token in tokens[:-1]:
        if not matcher.accept_token(token):
            return tokens[:accepted]
        accepted += 1
    if tokens and matcher.accept_token(tokens[-1]):
        if not _seam_open(matcher, trie, tokens[-1], vocab_size):
            return tokens
        matcher.rollback(1)
    return tokens[:accepted]


def forced_tokens(matcher, encode: Callable[[str], list[int]] | None = None, context: bytes = b"") -> list[int]:
    """take_forced_tokens' tokens, the matcher left where it was."""
    tokens = take_forced_tokens(matcher, encode, context)
    matcher.rollback(len(tokens))
    return tokens



def _spelled(data: bytes, context: bytes, encode, trie, vocab_size: int) -> list[int]:
    if encode is not None:
        for prefix in ((context, b"") if context else (b"",)):
            tokens = _encoded(prefix + data, encode, trie, vocab_size)
            if tokens is None:
                continue
            end, k = 0, 0
            while end < len(prefix):
                end += len(trie.token_bytes(tokens[k]))
                k += 1
            if end == len(prefix):
                return tokens[k:]
    return trie.greedy_tokens(data, vocab_size) or []


def _encoded(data: bytes, encode, trie, vocab_size: int) -> list[int] | None:
    """encode's tokens for data where they spell it exactly, else None."""
    try:
        tokens = encode(data.decode("utf-8"))
    except UnicodeDecodeError:  # the text starts or ends inside a character
        return None
    if tokens and all(0 <= t < vocab_size for t in tokens) and b"".join(map(trie.token_bytes, tokens)) == data:
        return tokens
    return None


def _seam_open(matcher, trie, token: int, vocab_size: int) -> bool:
    """Whether the matcher, just past `token`, could have taken a longer token starting with its
    bytes instead: one below its node in the preorder trie whose further bytes the grammar reads
    from here (its first further byte readable, then the rest walked, for at most
    MAX_SEAM_CHECKS of them). Bytes, not the previous state's row: a row not built yet costs a
    trie walk."""
    node = int(trie.token_node[token])
    below = trie.tok_ids[trie.tok_ptr[node + 1]:trie.tok_ptr[int(trie.skip[node])]]
    below = below[below < vocab_size]
    if not len(below):
        return False
    grammar, state, depth = matcher.grammar, matcher.state, len(trie.token_bytes(token))
    next_byte = np.frombuffer(trie.token_data, dtype=np.uint8)[np.asarray(trie.offsets)[below] + depth]
    below = below[grammar.readable_bytes(state)[next_byte]]
    for t in below[:MAX_SEAM_CHECKS].tolist():
        if grammar.advance_bytes(state, trie.token_bytes(t)[depth:]) is not None:
            return True
    return len(below) > MAX_SEAM_CHECKS
