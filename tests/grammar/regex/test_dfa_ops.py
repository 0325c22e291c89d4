"""dfa_ops: concatenation and bounded repetition of byte DFAs are the DFA of the regex they spell,
or None where the seam is not deterministic; cfg.lexer builds terminals that hold a long bounded
repetition this way."""
from dataclasses import replace

import pytest

from gdserve.grammar.cfg.lexer import _regex_dfa
from gdserve.grammar.regex.dfa_ops import concat, repeat
from gdserve.grammar.token_index import ByteDFA
from tests.grammar.dfa_check import direct, equivalent

# one JSON string character (a prefix-free code: a complete character never continues)
CHAR = r"(?:[^\x00-\x1f\x22\x5c]|\\[btnfr\x22\x2f\x5c]|\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))"


@pytest.mark.parametrize("left,right", [
    ('"', CHAR + "*"),
    ('"' + CHAR + "*", '"'),                # the closing quote starts no character
    ("[0-9]+", r"(?:\.[0-9]+)?"),           # the right side may be empty
    ("a?", "b"),                            # the left side may be empty
    ("(?:ab|a)", "c+"),                     # an accepting state that goes on, on other bytes
    ("\u00e9+", "[a-z]"),                   # multi-byte characters
])
def test_concat_is_the_regex_of_both(left, right):
    out = concat(direct(left), direct(right))
    assert out is not None
    assert equivalent(out, direct(f"(?:{left})(?:{right})"))
    assert not equivalent(out, direct(f"(?:{left})(?:{right})\\x01?"))


@pytest.mark.parametrize("left,right", [("a+", "a"), ("[a-z]*", "b"), ("(?:ab|a)", "b")])
def test_concat_refuses_a_seam_that_needs_both_ways(left, right):
    assert concat(direct(left), direct(right)) is None


@pytest.mark.parametrize("item,lo,hi", [
    (CHAR, 0, 20), (CHAR, 3, 12), (CHAR, 1, 1), (CHAR, 0, 1),
    ("ab", 2, 11), ("a|ab", 0, 9), ("[0-9]", 0, 30), ("x\u00e9", 5, 5),
])
def test_repeat_is_the_bounded_repetition(item, lo, hi):
    out = repeat(direct(item), lo, hi)
    assert out is not None
    assert equivalent(out, after_mark(f"(?:{item}){{{lo},{hi}}}"))
    assert not equivalent(out, after_mark(f"(?:{item}){{{lo},{hi + 1}}}"))


def after_mark(regex: str) -> ByteDFA:
    """outlines-core's DFA of regex, built after a leading byte 0x01 (which no regex here reads:
    a leading repetition takes outlines-core time exponential in the bound) and started there."""
    dfa = direct("\\x01" + regex)
    return replace(dfa, start=dfa.walk(dfa.start, b"\x01"))


@pytest.mark.parametrize("item", ["a+", "a?", "(?:a|aa)"])
def test_repeat_refuses_an_empty_or_ambiguous_item(item):
    assert repeat(direct(item), 0, 9) is None


def test_a_terminal_that_starts_with_a_long_repetition_is_composed():
    """(?:CHAR){1,64} directly would take outlines-core hours; composed, it is the language
    outlines-core gives after a leading mark."""
    regex = f"{CHAR}{{1,64}}"
    assert equivalent(_regex_dfa(regex), after_mark(regex))


@pytest.mark.parametrize("regex", [
    f'"{CHAR}{{0,64}}"',
    f'"k"[ \\t]?:[ \\t]?"{CHAR}{{2,40}}"(?:,"z":[0-9]+)?',
    f"{CHAR}(?:{CHAR}){{0,39}}",           # a nonempty string's form
    "[a-z]{1,300}",
])
def test_terminals_with_long_repetitions_keep_their_language(regex):
    assert equivalent(_regex_dfa(regex), after_mark(regex))
