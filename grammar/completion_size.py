"""How many tokens a constraint's shortest complete output takes, for refusing a max_tokens that
cannot hold one (instead of generating output that max_tokens cuts)."""
from gdserve.grammar.cfg.grammar import CfgGrammar
from gdserve.grammar.matcher import Grammar
from gdserve.grammar.token_index import TokenTrie

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
    return None if text is None else greedy_token_count(trie, grammar.vocab_size, text)


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


def greedy_token_count(trie: TokenTrie, vocab_size: int, text: bytes) -> int | None:
    """How many tokens cut `text` when each is the longest token (below vocab_size) that is a
    prefix of what is left; None if some byte starts no token."""
    count, at = 0, 0
    while at < len(text):
        longest = _longest_token(trie, vocab_size, text, at)
        if longest == 0:
            return None
        at += longest
        count += 1
    return count


def _longest_token(trie: TokenTrie, vocab_size: int, text: bytes, at: int) -> int:
    node, longest, end = -1, 0, len(trie.byte)
    for depth, b in enumerate(text[at:], start=1):
        child, stop = node + 1, (int(trie.skip[node]) if node >= 0 else end)
        while child < stop and trie.byte[child] != b:
            child = int(trie.skip[child])  # next sibling
        if child >= stop:
            break
        node = child
        ids = trie.tok_ids[trie.tok_ptr[node]:trie.tok_ptr[node + 1]]
        if (ids < vocab_size).any():
            longest = depth
    return longest
