"""Forced text: the bytes that every completion of a matcher's state continues with (empty
where the next byte is the model's to choose, or where the constraint may end here). Read off
the automaton byte by byte: while EOS is not allowed and exactly one byte can be read next, that
byte is forced. A grammar gives `readable_bytes(state)` (bool [256], a superset of the bytes it
can read: a byte outside it never is), `advance_bytes(state, data)` (None where refused) and
`accepts_eos(state)`; a superset only makes the text shorter, never wrong, since the one byte
left is read before it is taken."""
import numpy as np

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
