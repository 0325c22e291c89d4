"""regex_tree: generated regexes round-trip through the tree; nullable and nonempty agree with re."""
import itertools
import re

import pytest

from gdserve.grammar.regex_tree import expanded_size, has_rule, nonempty, nullable, parse, placeholder, to_regex

REGEXES = [
    r'\{[ \t]?"a"[ \t]?:[ \t]?(?:null|\[(?:x(?:,x)*)?\])[ \t]?\}',
    r"(?:[ \t]?|\n[ \t]{0,3})",
    r"a{2,3}b{1}c+d*\u00e9[^\"\\]?",
    r"(?:ab|)c?",
    r"(?:a?b?){0,2}",
    r"(?:a|b*)+",
    r"(?i:ab)c",
    r"[\]a-]\x41",
]
SAMPLES = ["".join(p) for n in range(5) for p in itertools.product("abcx,[] \t\n", repeat=n)]


@pytest.mark.parametrize("regex", REGEXES)
def test_round_trip_and_nonempty_agree_with_re(regex):
    tree = parse(regex)
    assert re.compile(to_regex(tree))  # prints valid regex text ...
    assert nullable(tree) == bool(re.fullmatch(regex, ""))
    ne = nonempty(tree)
    for text in SAMPLES:  # ... with the same language, and nonempty drops exactly ""
        want = bool(re.fullmatch(regex, text))
        assert bool(re.fullmatch(to_regex(tree), text)) == want, text
        assert (ne is not None and bool(re.fullmatch(to_regex(ne), text))) == (want and text != ""), text


def test_placeholders_are_atoms():
    tree = parse(r"\[(?:" + placeholder("r0") + r"(?:,)" + placeholder("r0") + r"{2})?\]")
    assert has_rule(tree) and not has_rule(parse(r"\[a\]"))
    assert to_regex(tree) == r"\[(?:" + placeholder("r0") + "," + placeholder("r0") + r"{2})?\]"
    assert nonempty(parse("(?:)")) is None


@pytest.mark.parametrize("regex,size", [("a{2,5}b", 6), ("(?:ab|c)*", 3), ("(?:a{3}){2}", 6), ("x?y+", 2),
                                        ("[0-9]{0,4}", 4)])
def test_expanded_size_writes_out_bounded_repetitions(regex, size):
    assert expanded_size(parse(regex)) == size
