"""Forced text (grammar/forced.py): what every completion of a matcher's state continues with, on
every constraint kind. Checked against a brute force that tries all 256 bytes at each step, and
on random walks: the allowed tokens agree with it and EOS waits for it."""
import random

import numpy as np
import pytest

from gdserve.grammar import compile_grammar
from gdserve.grammar.forced import forced_tokens, take_forced_tokens, text_encoder
from tests.grammar.walk import allowed_ids

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CONSTRAINTS = [
    ("regex", r"id-[0-9]{3}(ab|ac)x"),
    ("choice", ["The capital of France is Paris", "The capital of France is Lyon", "No"]),
    ("json", PERSON),
    ("json", {"enum": ["alpha", "alphabet", "beta"]}),
    ("json", {"type": "array", "items": {"const": "tool_call"}, "minItems": 1, "maxItems": 3}),
    ("json_object", None),
    ("grammar", 'start: "call " NAME "(" NAME ")"\nNAME: /[a-z]+/'),
    ("grammar", "builtin:function_call"),
]


def _compile(tokenizer, kind, spec, **options):
    return compile_grammar(kind, spec, tokenizer, **options)


def _brute_forced(grammar, state) -> bytes:
    """The forced text by trying every byte at each step."""
    out = bytearray()
    while not grammar.accepts_eos(state) and len(out) < 256:
        readable = [b for b in range(256) if grammar.advance_bytes(state, bytes((b,))) is not None]
        if len(readable) != 1:
            break
        out.append(readable[0])
        state = grammar.advance_bytes(state, bytes(readable))
    return bytes(out)


@pytest.mark.parametrize("kind,spec", CONSTRAINTS, ids=lambda x: str(x)[:24])
def test_forced_text_on_random_walks(smollm2_tokenizer, kind, spec):
    grammar = _compile(smollm2_tokenizer, kind, spec, open_objects=kind == "json")
    base = getattr(grammar, "base", grammar)
    rng, vocab = random.Random(7), smollm2_tokenizer.convert_ids_to_tokens
    token_bytes = base.trie.token_bytes
    for _ in range(4):
        matcher = grammar.matcher()
        for _ in range(40):
            forced = matcher.forced_bytes()
            assert forced == _brute_forced(base, matcher.state)
            allowed = allowed_ids(matcher)
            if forced:
                assert not allowed & grammar.eos_token_ids  # the constraint cannot end before it
                for token in allowed:
                    data = token_bytes(token)
                    assert data.startswith(forced) or forced.startswith(data), (forced, vocab(token))
            real = sorted(allowed - grammar.eos_token_ids)
            if not real:
                break
            assert matcher.accept_token(rng.choice(real))


def test_what_is_forced(smollm2_tokenizer):
    def forced(kind, spec, prefix="", **options):
        matcher = _compile(smollm2_tokenizer, kind, spec, **options).matcher()
        for token in smollm2_tokenizer.encode(prefix, add_special_tokens=False):
            assert matcher.accept_token(token)
        return matcher.forced_bytes()
    assert forced("regex", "abc(d|e)") == b"abc"
    assert forced("choice", ["The capital of France is Paris", "The capital of France is Lyon"]) == \
        b"The capital of France is "
    assert forced("json", PERSON, '{"na') == b'me"'
    assert forced("json", {"enum": ["alpha", "alphabet"]}, '"al') == b"pha"  # then '"' or "bet"
    assert forced("grammar", 'start: "hello" "world"') == b"helloworld"
    assert forced("grammar", 'start: "hello" NAME\nNAME: /[a-z]+/\n%ignore " "') == b""  # " " or "h"
    assert forced("regex", "[0-9]+") == b""
    matcher = _compile(smollm2_tokenizer, "regex", "ab").matcher()
    for token in smollm2_tokenizer.encode("ab", add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.forced_bytes() == b""  # complete: EOS is the model's choice
    assert matcher.accept_token(next(iter(matcher.grammar.eos_token_ids)))
    assert matcher.forced_bytes() == b""


def test_a_long_forced_text_comes_in_pieces(smollm2_tokenizer):
    grammar = _compile(smollm2_tokenizer, "regex", "x{600}")
    assert grammar.matcher().forced_bytes() == b"x" * 256
    state = grammar.advance_bytes(grammar.initial_state, b"x" * 500)
    assert grammar.forced_bytes(state) == b"x" * 100
    assert np.flatnonzero(grammar.readable_bytes(state)).tolist() == [ord("x")]


def _encoder(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("tokenizer_name", ["smollm2_tokenizer", "sp_tokenizer"])
@pytest.mark.parametrize("kind,spec", CONSTRAINTS, ids=lambda x: str(x)[:24])
def test_forced_tokens_spell_a_prefix_of_the_forced_text(request, tokenizer_name, kind, spec):
    """On random walks, with a byte-level BPE and a SentencePiece (byte fallback) vocabulary: the
    tokens spell the forced text but for its seam, the matcher accepts them in turn, and the
    call leaves the matcher where it was."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    grammar = _compile(tokenizer, kind, spec, open_objects=kind == "json")
    trie, rng, encode = grammar.trie, random.Random(11), _encoder(tokenizer)
    for _ in range(3):
        matcher = grammar.matcher()
        for _ in range(30):
            state, forced = matcher.state, matcher.forced_bytes()
            tokens = forced_tokens(matcher, encode)
            assert matcher.state == state
            spelled = b"".join(trie.token_bytes(t) for t in tokens)
            assert forced.startswith(spelled) and (not forced or tokens or len(forced) < 8)
            for token in tokens:
                assert matcher.accept_token(token)
            real = sorted(allowed_ids(matcher) - grammar.eos_token_ids)
            if not real:
                break
            assert matcher.accept_token(rng.choice(real))


def test_the_seam_is_left_to_the_model(smollm2_tokenizer):
    """The forced text "The capital of France is " ends where the model picks " Paris" or
    " Lyon", tokens that start with its last byte: that last piece is not forced."""
    encode = _encoder(smollm2_tokenizer)
    grammar = _compile(smollm2_tokenizer, "choice", ["The capital of France is Paris", "The capital of France is Lyon"])
    tokens = forced_tokens(grammar.matcher(), encode)
    assert b"".join(grammar.trie.token_bytes(t) for t in tokens) == b"The capital of France is"
    assert tokens == encode("The capital of France is")  # as the tokenizer spells it
    grammar = _compile(smollm2_tokenizer, "grammar", 'start: "hello" "world"')
    tokens = forced_tokens(grammar.matcher(), encode)  # the whole output: no seam after it
    assert b"".join(grammar.trie.token_bytes(t) for t in tokens) == b"helloworld"


def test_a_tokenization_that_does_not_spell_the_text_gives_way_to_the_greedy_one(sp_tokenizer):
    """SentencePiece prepends "▁" to the text it encodes: those tokens spell " The...", not the
    forced "The...", so the vocabulary's greedy tokenization spells it instead."""
    encode = _encoder(sp_tokenizer)
    grammar = _compile(sp_tokenizer, "regex", "The capital of France is (Paris|Lyon)")
    assert b"".join(grammar.trie.token_bytes(t) for t in encode("The capital")).startswith(b" ")
    tokens = forced_tokens(grammar.matcher(), encode)
    greedy = grammar.trie.greedy_tokens(b"The capital of France is ", grammar.vocab_size)
    assert tokens in (greedy, greedy[:-1])  # less the last where a longer token may cross the seam
    assert b"".join(grammar.trie.token_bytes(t) for t in tokens).startswith(b"The capital of France is")


def test_forced_text_is_spelled_in_the_context_of_the_models_token(smollm2_tokenizer):
    """After the model's "a", the forced `, "age": ` is spelled as the tokenizer spells the two
    together, from the boundary after "a". After the model's "{", the tokenizer would merge
    `{"`: the model's token stays, and the forced text is spelled alone."""
    encode = text_encoder(smollm2_tokenizer)
    grammar = _compile(smollm2_tokenizer, "regex", r'(a|bb), "age": [0-9]+')
    matcher = grammar.matcher()
    assert matcher.accept_token(encode("a")[0])
    assert forced_tokens(matcher, encode, b"a") == encode('a, "age": ')[1:]
    grammar = _compile(smollm2_tokenizer, "regex", r'\{"name": "[a-z]+"\}')
    matcher = grammar.matcher()
    assert matcher.accept_token(encode("{")[0])
    assert encode('{"name"')[0] != encode("{")[0]  # `{"` is one token
    assert forced_tokens(matcher, encode, b"{") == forced_tokens(matcher, encode, b"") == encode('"name": "')


def test_taken_tokens_move_the_matcher_within_the_limit(smollm2_tokenizer):
    encode = text_encoder(smollm2_tokenizer)
    grammar = _compile(smollm2_tokenizer, "regex", "The answer to the question is (yes|no)")
    matcher = grammar.matcher()
    tokens = forced_tokens(matcher, encode)
    assert len(tokens) > 3
    assert take_forced_tokens(matcher, encode, limit=2) == tokens[:2]
    assert matcher.forced_bytes() == b"The answer to the question is "[len(b"".join(
        grammar.trie.token_bytes(t) for t in tokens[:2])):]
    assert take_forced_tokens(matcher, encode) == tokens[2:]
    assert take_forced_tokens(matcher, encode) == []  # the rest is the model's


@pytest.mark.parametrize("kind,spec", CONSTRAINTS, ids=lambda x: str(x)[:24])
def test_a_last_token_is_forced_only_where_no_longer_one_could_cross_the_end(smollm2_tokenizer, kind, spec):
    """On random walks, against the rows: where the forced tokens are taken, the row before the
    last of them allows no token that starts with its bytes and goes on."""
    grammar = _compile(smollm2_tokenizer, kind, spec, open_objects=kind == "json")
    trie, rng, encode = grammar.trie, random.Random(5), text_encoder(smollm2_tokenizer)
    for _ in range(3):
        matcher = grammar.matcher()
        for _ in range(30):
            tokens = forced_tokens(matcher, encode)
            if tokens:
                for token in tokens[:-1]:
                    assert matcher.accept_token(token)
                last = trie.token_bytes(tokens[-1])
                allowed = allowed_ids(matcher) - grammar.eos_token_ids
                assert not [t for t in allowed if len(trie.token_bytes(t)) > len(last) and
                            trie.token_bytes(t).startswith(last)], smollm2_tokenizer.convert_ids_to_tokens(tokens)
                matcher.rollback(len(tokens) - 1)
            real = sorted(allowed_ids(matcher) - grammar.eos_token_ids)
            if not real:
                break
            assert matcher.accept_token(rng.choice(real))
