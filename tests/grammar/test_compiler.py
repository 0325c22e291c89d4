"""compile_grammar end to end on SmolLM2: every random path through the bitmask is a full match."""
import json
import random
import re
import resource
import subprocess
import sys

import pytest

from gdserve.grammar import GrammarError, compile_grammar
from gdserve.grammar.vocabulary import token_vocabulary
from tests.grammar.walk import Walker, feed

REGEXES = {
    "phone": r"\(?[0-9]{3}\)? ?[0-9]{3}-[0-9]{4}",
    "iso_date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "email": r"[a-z]+@[a-z]+\.com",
    "enum": r"(red|green|blue|dark (red|green|blue))",
}
CHOICES = ["a.b", "a", "ab", "abc", "(x|y)*", '"quoted"', "naïve 日本", "$100 [USD]",
           "back\\slash", "a+b?", "{1,2}", "tab\there", "-~&#", "Ⅻ🙂"]


def decode(vocab, ids) -> str:
    return b"".join(vocab.token_bytes[i] for i in ids).decode()


@pytest.mark.parametrize("name", REGEXES)
def test_random_paths_fullmatch(smollm2_tokenizer, name):
    grammar = compile_grammar("regex", REGEXES[name], smollm2_tokenizer)
    vocab, walker, rng = token_vocabulary(smollm2_tokenizer), Walker(grammar), random.Random(0)
    for _ in range(25):
        ids = walker.walk(rng, random_steps=rng.randrange(8))
        text = decode(vocab, ids)
        assert text == smollm2_tokenizer.decode(ids)
        assert re.fullmatch(REGEXES[name], text), text
        assert feed(grammar, smollm2_tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("name, valid, invalid", [
    ("phone", "(555) 123-4567",
     ["(555) 123-456", "(555) 123-45678", "555-123-4567", "(5a5) 123-4567"]),
    ("iso_date", "2024-02-29", ["2024-13-01", "2024-00-10", "2024-1-10", "2024-02-32 "]),
    ("email", "jo@example.com",
     ["Jo@example.com", "jo@example.co", "jo@@example.com", "@example.com"]),
    ("enum", "dark blue", ["dark", "Dark blue", "blue ", "dark  red", "redd"]),
])
def test_valid_accepted_mutants_rejected(smollm2_tokenizer, name, valid, invalid):
    grammar = compile_grammar("regex", REGEXES[name], smollm2_tokenizer)
    encode = lambda s: smollm2_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert feed(grammar, encode(valid))
    for text in invalid:
        assert not re.fullmatch(REGEXES[name], text)
        assert not feed(grammar, encode(text)), text


def test_choice_paths_are_choices(smollm2_tokenizer):
    grammar = compile_grammar("choice", CHOICES, smollm2_tokenizer)
    vocab, walker, rng = token_vocabulary(smollm2_tokenizer), Walker(grammar), random.Random(1)
    seen = set()
    for _ in range(60):
        text = decode(vocab, walker.walk(rng, random_steps=rng.randrange(6)))
        assert text in CHOICES
        seen.add(text)
    assert len(seen) > len(CHOICES) // 2
    for choice in CHOICES:
        assert feed(grammar, smollm2_tokenizer.encode(choice, add_special_tokens=False)), choice
    for other in ["aXb", "", "abcd", "x", "xy", "(x|y)", "quoted", "$100 USD", "a+b"]:
        assert not feed(grammar, smollm2_tokenizer.encode(other, add_special_tokens=False)), other


def test_grammar_attributes(smollm2_tokenizer):
    grammar = compile_grammar("choice", ["yes", "no"], smollm2_tokenizer)
    assert (grammar.kind, grammar.regex, grammar.relaxed) == ("choice", "(yes|no)", [])
    assert grammar.vocab_size == 49152 and grammar.eos_token_ids == {2}
    wide = compile_grammar("regex", "^(yes|no)$", smollm2_tokenizer, vocab_size=49280,
                           eos_token_ids={0})
    assert wide.regex == "(yes|no)" and wide.vocab_size == 49280
    assert wide.eos_token_ids == {0, 2}


def test_unsupported_kinds(smollm2_tokenizer):
    with pytest.raises(GrammarError, match=r"invalid Lark grammar.*Unclosed parenthesis, at line 1 column 9"):
        compile_grammar("grammar", "start: (", smollm2_tokenizer)
    with pytest.raises(GrammarError, match="unknown constraint kind 'xml'"):
        compile_grammar("xml", "<a/>", smollm2_tokenizer)
    with pytest.raises(GrammarError, match="vocab_size"):
        compile_grammar("regex", "a", smollm2_tokenizer, vocab_size=0)


def test_regex_the_vocabulary_cannot_spell(byte_tokenizer, smollm2_tokenizer):
    # SmolLM2 has no token for byte 0x04; outlines-core reports the unreachable state.
    with pytest.raises(GrammarError, match="incompatible"):
        compile_grammar("regex", r"a\x04", smollm2_tokenizer)
    assert compile_grammar("regex", r"a\x04", byte_tokenizer).kind == "regex"


def test_json_schema(smollm2_tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    grammar = compile_grammar("json", schema, smollm2_tokenizer)
    assert grammar.kind == "json" and grammar.regex
    encode = lambda s: smollm2_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert feed(grammar, encode('{"a": 12}'))
    assert not feed(grammar, encode('{"a": "12"}'))
    assert not feed(grammar, encode('{"b": 12}'))
    vocab, walker, rng = token_vocabulary(smollm2_tokenizer), Walker(grammar), random.Random(0)
    for _ in range(10):
        value = json.loads(decode(vocab, walker.walk(rng, random_steps=4)))
        assert isinstance(value["a"], int)


HUGE_ARRAY = {"type": "object", "required": ["values"], "properties": {"values": {
    "type": "array", "maxItems": 50,
    "items": {"type": "array", "maxItems": 26,
              "items": {"type": ["string", "number", "boolean", "null"], "maxLength": 1000}}}}}


def _compile_in_a_capped_process(kind: str, spec: object, model_dir) -> str:
    """What compiling spec prints in a child process whose memory is capped at 3 GiB (an abort
    there fails this test, not the test run)."""
    script = f"""
import json
from gdserve.grammar import GrammarError, compile_grammar
from gdserve.models import load_tokenizer
tok = load_tokenizer({str(model_dir)!r})
try:
    g = compile_grammar({kind!r}, json.loads({json.dumps(json.dumps(spec))}), tok)
    ids = tok.encode(json.dumps({{"values": [["a", 1, True, None]] * 3}}), add_special_tokens=False)
    m = g.matcher()
    print(type(g).__name__, all(m.accept_token(t) for t in ids) and m.accept_token(tok.eos_token_id))
except GrammarError as e:
    print("GrammarError:", e)
"""
    cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # noqa: E731
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          preexec_fn=cap)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_schema_whose_regex_automaton_is_too_large_takes_the_grammar_path(smollm2_dir):
    """Bounded arrays of bounded strings nested two deep: too large an automaton as one regex
    (refused by size, never handed to a construction that would abort the process on memory),
    so each subschema becomes a rule of the grammar path, exact."""
    assert _compile_in_a_capped_process("json", HUGE_ARRAY, smollm2_dir) == "CfgGrammar True"


def test_a_regex_too_large_for_an_automaton_is_refused_by_size(smollm2_dir):
    out = _compile_in_a_capped_process("regex", "([a-z]{0,3000}x){0,3000}", smollm2_dir)
    assert out.startswith("GrammarError:") and "bounded repetitions nested" in out
