"""The lazy token index allows exactly what an outlines-core Index over the whole vocabulary
allows (the path it replaced), state by state, with the C walk and with the numpy one."""
import pickle

import numpy as np
import pytest
import torch
from outlines_core import Index

from gdserve.grammar import compile_grammar
from gdserve.grammar.token_index import indexed_pattern
from gdserve.grammar.token_index import TokenIndex, mask_library
from gdserve.grammar.vocabulary import START_TOKEN_ID, token_vocabulary

REGEXES = [r"[0-9]{3}-[a-z]+", r"(a|ab)*c?", r"(yes|no|maybe)", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
           r"\"([^\"\\\x00-\x1f]|\\[\"\\/bfnrt])*\"", r"[ \t]?|\n[ \t]{0,8}", r"é[^a]{2,5}x",
           r"\{\n?[ ]{0,4}\"a\":[ ]?(true|false|null)\}", r"[\u4e00-\u9fff]+", r"(ab|cd){0,3}e*"]


def pairs_agree(grammar, ref: Index, max_states: int = 40) -> int:
    """Walk (our state, reference state) pairs from the start; returns how many were compared."""
    start = ref.get_next_state(ref.get_initial_state(), START_TOKEN_ID)
    todo, seen = [(grammar.initial_state, start)], set()
    while todo and len(seen) < max_states:
        ours, theirs = todo.pop(0)
        if (ours, theirs) in seen:
            continue
        seen.add((ours, theirs))
        mine = grammar.transitions(ours)
        ref_edges = {t: n for t, n in (ref.get_transitions().get(theirs) or {}).items()
                     if t < grammar.vocab_size and t not in grammar.eos_token_ids}
        assert mine.keys() == ref_edges.keys(), grammar.regex
        assert grammar.is_final(ours) == ref.is_final_state(theirs)
        row = grammar.state_mask(ours).row.numpy().view(np.uint32)
        bits = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))
        eos = grammar.eos_token_ids if grammar.is_final(ours) else set()
        assert set(bits.tolist()) == mine.keys() | eos
        todo.extend((mine[t], ref_edges[t]) for t in sorted(mine)[::max(1, len(mine) // 50)])
    return len(seen)


@pytest.fixture(params=["native", "numpy"])
def walk(request, monkeypatch):
    if request.param == "native":
        if mask_library() is None:
            pytest.skip("no C compiler: the numpy walk only")
    else:
        monkeypatch.setattr("gdserve.grammar.token_index.mask_library", lambda: None)
    return request.param


@pytest.mark.parametrize("regex", REGEXES)
def test_masks_match_outlines_core_index(smollm2_tokenizer, walk, regex):
    grammar = compile_grammar("regex", regex, smollm2_tokenizer)
    vocab = token_vocabulary(smollm2_tokenizer)
    ref = Index(indexed_pattern(grammar.regex), vocab.outlines_vocabulary())
    assert pairs_agree(grammar, ref) > 1


def test_json_schema_masks_match_outlines_core_index(smollm2_tokenizer, sp_tokenizer, walk):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                               "n": {"type": "integer", "minimum": 3}},
              "required": ["n"]}
    for tokenizer in (smollm2_tokenizer, sp_tokenizer):
        grammar = compile_grammar("json", schema, tokenizer)
        ref = Index(indexed_pattern(grammar.regex),
                    token_vocabulary(tokenizer).outlines_vocabulary())
        assert pairs_agree(grammar, ref, max_states=60) > 10


def test_native_and_numpy_walks_agree(smollm2_tokenizer, monkeypatch):
    if mask_library() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("GDSERVE_LAZY_DFA", "0")  # every state of the whole DFA
    grammar = compile_grammar("json", {"type": "array", "items": {"type": "string"}},
                              smollm2_tokenizer)
    index: TokenIndex = grammar.index
    states = range(index.dfa.dead + 1)
    native = [index.allowed_words(s, grammar.vocab_size) for s in states]
    nexts = [index.next_states(s) for s in states]
    monkeypatch.setattr("gdserve.grammar.token_index.mask_library", lambda: None)
    for s, (words, count) in zip(states, native):
        fallback, fallback_count = index.allowed_words(s, grammar.vocab_size)
        assert count == fallback_count and np.array_equal(words, fallback)
        assert np.array_equal(nexts[s], index.next_states(s))


@pytest.mark.parametrize("regex", [r'"[^"\\\x00-\x1f]{0,12}", ?"', r"[a-zA-Z ]{8}(?:[a-z]{3}7)?",
                                   r"[a-zA-Z]{0,200}!", r'\{"s": "[a-z ]{0,40}", "t": "[^"]{2,9}"\}'])
def test_base_rows_agree_with_the_numpy_walk(smollm2_tokenizer, monkeypatch, regex):
    """A string's states start from the base row (its characters' tokens, at most as many as
    the string has left) and walk only the subtrees it does not cover, for their rows and for
    each token's distance to completion after it: bounded strings that close after their last
    character, ones that may go on past it, and ones longer than any token, every state against
    the numpy walk."""
    if mask_library() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("GDSERVE_LAZY_DFA", "0")  # every state of the whole DFA
    index: TokenIndex = compile_grammar("regex", regex, smollm2_tokenizer).index
    states = range(index.dfa.dead)
    based = [index.loops(s) for s in states if index.loops(s).base_row is not None]
    assert len(based) > 5
    if "{8}" in regex:  # more characters may follow the 8: the walk stops at them, not at the trie's depth
        assert any(loops.base_args[2] < 2**31 - 1 for loops in based)
    native = [(index.allowed_words(s, 49152), index.next_distances(s)) for s in states]
    monkeypatch.setattr("gdserve.grammar.token_index.mask_library", lambda: None)
    for s, ((words, count), distances) in zip(states, native):
        fallback, fallback_count = index.allowed_words(s, 49152)
        assert count == fallback_count and np.array_equal(words, fallback), s
        assert np.array_equal(distances, index.next_distances(s)), s  # the budget rows' input


@pytest.mark.parametrize("split", [False, True])
def test_native_and_numpy_crossing_walks_agree(smollm2_tokenizer, monkeypatch, split):
    """The grammar path's walk from each lexer state: the same tokens inside, and the same nodes
    where a lexeme ends and the next begins, with their terminals (split: at every node below an
    accepting state, which are more)."""
    if mask_library() is None:
        pytest.skip("no C compiler")
    grammar = compile_grammar("json_object", None, smollm2_tokenizer)
    dfa, accept = grammar.lexer.arrays()
    index = TokenIndex(dfa, grammar.trie)
    states = range(dfa.dead)
    native = [index.crossings_walk(s, grammar.vocab_size, accept, split) for s in states]
    crossings = sum(len(nodes) for _, nodes, _ in native)
    assert crossings > 0
    if split:
        assert crossings > sum(len(index.crossings_walk(s, grammar.vocab_size, accept)[1]) for s in states)
    monkeypatch.setattr("gdserve.grammar.token_index.mask_library", lambda: None)
    for s, expected in zip(states, native):
        for ours, theirs in zip(expected, index.crossings_walk(s, grammar.vocab_size, accept, split)):
            assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("split", [False, True])
def test_loop_subtrees_taken_whole_agree_with_the_full_walk(smollm2_tokenizer, monkeypatch, split):
    """In a state that loops on many bytes (a string's interior; an undeclared key's rest, two
    bytes past an open object's `{"`) or counts down on them (a string of at most 40
    characters), a trie subtree whose bytes all loop, or count down no further than the bound,
    is taken whole (a string's own states start from the base row instead; subtree walks, which
    take none, from their loop table): the same tokens and crossings as the walk node by node."""
    if mask_library() is None:
        pytest.skip("no C compiler")
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "note": {"type": "string", "maxLength": 40}}}
    grammar = compile_grammar("json", schema, smollm2_tokenizer, open_objects=True)
    matcher, bitmask = grammar.matcher(), torch.zeros(1, (grammar.vocab_size + 31) // 32, dtype=torch.int32)
    for token in smollm2_tokenizer.encode('{"name": "a b", "note": "c", "other": "d"}', add_special_tokens=False):
        matcher.fill_next_token_bitmask(bitmask, 0)
        assert matcher.accept_token(token)
    dfa, accept = grammar.lexer.arrays()
    index = TokenIndex(dfa, grammar.trie)
    found = {s: index.loops(s, accept, split) for s in range(dfa.dead)}
    tables = {s: loops.states.tolist() for s, loops in found.items() if len(loops.states)}
    assert any(s not in states for s, states in tables.items())  # a string ahead of the state
    limits = [limit for s in tables for limit in found[s].limits.tolist()]
    assert 2**31 - 1 in limits and min(limits) < 40  # strings: a loop, and the note's count down
    based = [loops.base_row[1] for loops in found.values() if loops.base_row is not None]
    assert grammar.trie.max_depth in based and min(based) < 40  # the name's states, the note's (≤ 40 left)
    roots = np.flatnonzero(grammar.trie.depth == 1)[::7]
    walks = {s: (index.crossings_walk(s, grammar.vocab_size, accept, split),
                 index.subtrees_walk(mask_library(), s, roots, grammar.vocab_size, accept, split))
             for s in found}
    monkeypatch.setattr("gdserve.grammar.token_index.MIN_LOOP_BYTES", 10**9)
    index = TokenIndex(dfa, grammar.trie)
    for s, (whole, subtrees) in walks.items():
        loops = index.loops(s, accept, split)
        assert not len(loops.states) and loops.base_row is None
        for ours, theirs in zip(whole + subtrees, index.crossings_walk(s, grammar.vocab_size, accept, split)
                                + index.subtrees_walk(mask_library(), s, roots, grammar.vocab_size, accept, split)):
            assert np.array_equal(ours, theirs)


def test_pickled_index_walks_its_own_arrays(smollm2_tokenizer, monkeypatch):
    """A grammar compiled in a worker arrives pickled: the C walks' pointers cached there must not
    travel (the server crashed on them); the copy's masks equal the original's."""
    monkeypatch.setenv("GDSERVE_LAZY_DFA", "0")  # the whole DFA (regex/test_lazy_dfa.py pickles a lazy one)
    grammar = compile_grammar("regex", r"\"[a-z ]{0,30}\"(,[0-9]+)?", smollm2_tokenizer)
    states = list(range(grammar.index.dfa.dead))
    expected = [grammar.index.allowed_words(s, grammar.vocab_size)[0] for s in states]
    data = pickle.dumps(grammar)
    del grammar
    copy = pickle.loads(data)
    assert "_static_args" not in copy.index.__dict__
    for s, words in zip(states, expected):
        assert np.array_equal(copy.index.allowed_words(s, copy.vocab_size)[0], words)


def test_vocab_size_narrower_and_wider(smollm2_tokenizer):
    narrow = compile_grammar("regex", "[a-z]+", smollm2_tokenizer, vocab_size=1000)
    assert max(narrow.transitions(narrow.initial_state)) < 1000
    assert not narrow.matcher().accept_token(smollm2_tokenizer.convert_tokens_to_ids("hello"))
    wide = compile_grammar("regex", "[a-z]+", smollm2_tokenizer, vocab_size=49280)
    assert not wide.matcher().accept_token(49200)
    assert wide.state_mask(wide.initial_state).row.shape == (49280 // 32,)


def test_pickle_round_trip_shares_the_trie(smollm2_tokenizer):
    grammar = compile_grammar("regex", "[0-9]+x", smollm2_tokenizer)
    grammar.state_mask(grammar.initial_state)
    copy = pickle.loads(pickle.dumps(grammar))
    assert copy.index.trie is grammar.index.trie and not copy._masks
    m = copy.matcher()
    for token in smollm2_tokenizer.encode("123x", add_special_tokens=False):
        assert m.accept_token(token)
    assert m.accept_token(2) and m.is_terminated()


def _greedy_reference(text: bytes, spellings: dict[bytes, int], vocab_size: int) -> int | None:
    """The longest token at each position, by trying every length from the longest down."""
    longest = max(map(len, spellings))
    i = count = 0
    while i < len(text):
        n = next((n for n in range(min(longest, len(text) - i), 0, -1)
                  if spellings.get(text[i:i + n], vocab_size) < vocab_size), 0)
        if not n:
            return None
        i, count = i + n, count + 1
    return count


@pytest.mark.parametrize("vocab_size", [None, 300])
def test_greedy_count_takes_the_longest_token_at_each_step(smollm2_tokenizer, sp_tokenizer, monkeypatch, vocab_size):
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b'{}[]":,abcdefgh 0123456789\n\\\xc3\xa9', dtype=np.uint8)
    texts = [b'{"employee_email":"a@b.c","lines":[{"date":"2024-01-01","amount":12.5}]}', b"", b"\xff\xfe"]
    texts += [rng.choice(alphabet, rng.integers(0, 60)).tobytes() for _ in range(100)]
    for tokenizer in (smollm2_tokenizer, sp_tokenizer):
        vocab = token_vocabulary(tokenizer)
        trie = compile_grammar("regex", "a", tokenizer).index.trie
        size = vocab_size or vocab.size
        spellings = {}
        for token_id, data in enumerate(vocab.token_bytes):
            if data:
                spellings[data] = min(token_id, spellings.get(data, token_id))
        counts = [trie.greedy_count(t, size) for t in texts]
        assert counts == [_greedy_reference(t, spellings, size) for t in texts]
        assert counts[0] <= len(texts[0]) and counts[1] == 0
        if tokenizer is smollm2_tokenizer and vocab_size is None:  # a BPE vocabulary: well under a token a byte
            assert counts[0] < 0.6 * len(texts[0])
        monkeypatch.setattr("gdserve.grammar.token_index.mask_library", lambda: None)
        assert [trie.greedy_count(t, size) for t in texts] == counts
        monkeypatch.undo()
