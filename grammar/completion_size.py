"""How many tokens a constraint's shortest complete output takes, for refusing a max_tokens that
cannot hold one (instead of generating output that max_tokens cuts)."""
from gdserve.grammar.cfg.grammar import CfgGrammar
from gdserve.grammar.matcher import Grammar

PRINTABLE_FIRST = sorted(range(256), key=lambda b: (not 32 < b < 127, b))


def shortest_completion_bytes(grammar) -> int | None:
    """Bytes of the shortest completion from the start, which bound its tokens from above (every
    byte is a token in byte-level vocabularies); None where no completion is known (or the grammar
    is of a kind this module does not read)."""
    grammar = getattr(grammar, "base", grammar)  # a wrapper keeping state beside its automaton
    if isinstance(grammar, CfgGrammar):
        text = grammar.completion(grammar.initial)
        return None if text is None else len(text)
    return grammar.distance(grammar.initial_state) if isinstance(grammar, Grammar) else None


def min_completion_tokens(grammar) -> int | None:
    """Tokens of the shortest completion from the start, its bytes cut greedily into the longest
    tokens of the vocabulary: a count a sequence can reach (a cleverer cut may need fewer). None
    where no completion is known (a grammar whose completion search gave up)."""
    grammar = getattr(grammar, "base", grammar)  # a wrapper keeping state beside its automaton
    if isinstance(grammar, CfgGrammar):
        text, trie = grammar.completion(grammar.initial), grammar.trie
    else:
        text, trie = shortest_text(grammar), grammar.index.trie
    return None if text is None else trie.greedy_count(text, grammar.vocab_size)


def shortest_text(grammar: Grammar) -> bytes:
    """The shortest bytes from the start to an accepting state, down the DFA's distances
    (printable bytes preferred, one byte of each class tried)."""
    dfa, state, out = grammar.index.dfa, grammar.initial_state, bytearray()
    while not grammar.is_final(state):
        want, tried = grammar.distance(state) - 1, set()
        for b in PRINTABLE_FIRST:
            if dfa.classes[b] in tried:
                continue
            tried.add(dfa.classes[b])
            nxt = dfa.walk(state, bytes([b]))
            if nxt != dfa.dead and grammar.distance(nxt) == want:
                out.append(b)
                state = nxt
                break
    return bytes(out)
