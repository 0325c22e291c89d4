"""Regex preparation (anchors, Python-only syntax, clear errors) and choice escaping."""
import itertools
import re

import pytest

from gdserve.grammar import GrammarError, compile_grammar
from gdserve.grammar.regex.syntax import choice_regex, escape_literal, prepare_regex, skeleton
from gdserve.grammar.vocabulary import token_vocabulary
from tests.grammar.walk import feed


@pytest.mark.parametrize("pattern, prepared", [
    (r"^[a-z]+$", r"[a-z]+"),
    (r"\A[0-9]{2}\Z", r"[0-9]{2}"),
    (r"\d{3}\z", r"\d{3}"),
    (r"a\$", r"a\$"),               # an escaped $ is a literal
    (r"[$^]x", r"[$^]x"),           # inside a class too
    (r"a{,3}", r"a{0,3}"),          # Python's {,n}
    (r"\{,3}[{,]", r"\{,3}[{,]"),   # not a quantifier
    (r"(?P<year>[0-9]{4})", r"(?P<year>[0-9]{4})"),
])
def test_prepare_regex(pattern, prepared):
    assert prepare_regex(pattern) == prepared


@pytest.mark.parametrize("pattern, why", [
    (r"(?=a)a", "lookaround"), (r"a(?!b)", "lookaround"), (r"(?<=a)b", "lookaround"),
    (r"(?<!a)b", "lookaround"), (r"(a)\1", "backreference"), (r"(?P<x>a)(?P=x)", "backreference"),
    (r"a++", "possessive"), (r"[ab]*+c", "possessive"), (r"a{2,3}+", "possessive"),
    (r"(?>ab)", "atomic"), (r"(a)?(?(1)b|c)", "conditional"), (r"\bword\b", "word boundaries"),
    (r"a^b", "anchors"), (r"a$|b", "anchors"), (r"a\Zb", "anchors"), (r"\012", "octal"),
    (r"\N{EM DASH}", "named Unicode"), (r"a(?#comment)", "comment"),
])
def test_unsupported_python_constructs_are_named(pattern, why):
    with pytest.raises(GrammarError, match=why) as info:
        prepare_regex(pattern)
    assert "position" in str(info.value)


@pytest.mark.parametrize("pattern", [r"[(?=]x", r"\(\?=x", r"[\^]a", r"a\+\+", r"[a++]", r"\\b",
                                     r"[\b]", r"x\}+"])
def test_no_false_alarms_inside_classes_or_escapes(pattern):
    assert prepare_regex(pattern) == pattern


@pytest.mark.parametrize("pattern, why", [("a)(b", r"unbalanced '\)' at position 1"), ("ab)", "unbalanced"),
                                          ("(a|b", r"1 '\(' not closed"), ("((a)", "not closed")])
def test_unbalanced_parentheses_are_refused(byte_tokenizer, pattern, why):
    """A stray `)` would otherwise close the group the regex is wrapped in and change its language."""
    with pytest.raises(GrammarError, match=why):
        compile_grammar("regex", pattern, byte_tokenizer)


@pytest.mark.parametrize("pattern", [r"[)(]+", r"\)\(", r"(a[)])", r"(?:x)(y)"])
def test_parentheses_in_classes_and_escapes_are_not_groups(pattern):
    assert prepare_regex(pattern) == pattern


def test_skeleton_blanks_classes_and_escaped_symbols():
    assert skeleton(r"a[^]$]\$\1(?=") == r"a_____" + "__" + r"\1(?="
    assert len(skeleton(r"[a[b]c]d")) == len(r"[a[b]c]d")


def test_outlines_errors_carry_its_text_and_pythons(byte_tokenizer):
    with pytest.raises(GrammarError, match=r"outlines-core.*min repeat greater than max repeat"):
        compile_grammar("regex", r"x{3,1}", byte_tokenizer)
    with pytest.raises(GrammarError, match="outlines-core"):
        compile_grammar("regex", r"[\d-z]", byte_tokenizer)
    with pytest.raises(GrammarError, match="must be a string"):
        compile_grammar("regex", 42, byte_tokenizer)


def test_rust_syntax_is_the_dialect(byte_tokenizer):
    g = compile_grammar("regex", r"\p{Greek}[[:digit:]]", byte_tokenizer)
    assert g.regex == r"\p{Greek}[[:digit:]]"


def test_escape_literal_round_trips_through_python_re():
    text = r"a.b*c+d?(e)[f]{g}|h^i$j\k#l&m-n~o 'p' \"q\" ü日🙂"
    assert re.fullmatch(escape_literal(text), text)


def test_choice_regex():
    assert choice_regex(["a.b", "c"]) == r"(a\.b|c)"
    for bad, why in [([], "non-empty"), ("abc", "non-empty list"), (None, "non-empty"),
                     (["a", 1], "must be strings"), ([["a"]], "must be strings")]:
        with pytest.raises(GrammarError, match=why):
            choice_regex(bad)


DIFFERENTIAL = [r"a|ab", r"ab|a", r"a*|b", r"(|a)", r"a+?", r"(a|ab)(c|bc)?", r"[ab]*c|a",
                r"(a|b)*?c?", r"a{0,2}b+?", r"(?:ab|a)(?:bc|c)?", r"a*b*|c", r"^(a|)b?$", r"",
                r"(?i)A|b", r"(a|aa)*c"]


@pytest.mark.parametrize("pattern", DIFFERENTIAL)
def test_language_equals_python_fullmatch(byte_tokenizer, pattern):
    """Every string over {a, b, c} up to length 4: accepted iff re.fullmatch. (outlines-core alone
    indexes a leftmost-first DFA: `a|ab` would lose "ab", `a*|b` would lose "b".)"""
    grammar = compile_grammar("regex", pattern, byte_tokenizer)
    vocab = token_vocabulary(byte_tokenizer)
    token_of = {b: i for i, b in enumerate(vocab.token_bytes) if b is not None}
    for text in ("".join(p) for n in range(5) for p in itertools.product("abc", repeat=n)):
        ids = [token_of[c.encode()] for c in text]
        assert feed(grammar, ids) == bool(re.fullmatch(pattern, text)), text
