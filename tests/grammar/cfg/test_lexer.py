"""cfg.lexer: a terminal's DFA built from a literal prefix chained before the DFA of the rest is
the DFA of the whole regex."""
import pytest

from gdserve.grammar.cfg.lexer import _literal_prefix, _regex_dfa
from tests.grammar.dfa_check import direct, equivalent


@pytest.mark.parametrize("regex,prefix,rest", [
    (r'"height"[ \t]?:[ \t]?-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?', b'"height', r'"[ \t]?:[ \t]?-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?'),
    (r"\{,(?:[ \t]?|\n[ \t]{0,24})", b"{", r",(?:[ \t]?|\n[ \t]{0,24})"),
    (r"\{\n[ \t]*", b"", r"\{\n[ \t]*"),  # \n is no plain character here
    (r'"\xe9t\x41"x*', '"\xe9tA'.encode(), '"x*'),  # non-ASCII: its UTF-8 bytes
    (r"a\.b[0-9]+", b"a.", "b[0-9]+"),
    (r'"k"(?:"(?:[^"\\]|\\.)*")?', b'"k', r'"(?:"(?:[^"\\]|\\.)*")?'),  # the rest may match ""
    (r'"(?:[^"\\]|\\.){3,256}"', b"", r'"(?:[^"\\]|\\.){3,256}"'),  # one character: built whole
    (r"ab|cd", b"", r"ab|cd"),  # no common literal start read
    (r"abc", b"ab", "c"),
    (r"ab?c", b"", "ab?c"),
])
def test_chained_prefix_is_the_whole_regex(regex, prefix, rest):
    assert _literal_prefix(regex) == (prefix, rest)
    assert equivalent(_regex_dfa(regex), direct(regex))
    assert not equivalent(_regex_dfa(regex), direct(regex + "x"))
