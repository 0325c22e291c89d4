"""regex.tree: generated regexes round-trip through the tree; nullable and nonempty agree with re."""
import itertools
import re

import pytest

from gdserve.grammar.regex.tree import Alt, Atom, ByteSizes, nonempty, nullable, parse, placeholder, to_regex

REGEXES = [
    r'\{[ \t]?"a"[ \t]?:[ \t]?(?:null|\[(?:x(?:,x)*)?\])[ \t]?\}',
    r"(?:[ \t]?|\n[ \t]{0,3})",
    r"a{2,3}b{1}c+d*\u00e9[^\"\\]?",
    r"(?:ab|)c?",
    r"(?:a?b?){0,2}",
    r"(?:a|b*)+",
    r"(?i:ab)c",
    r"[\]a-]\x41",
    r"[(]a(?:[)]b|c)",
    r"[]()](?:x|[^](])*",
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
    assert tree.rules and not parse(r"\[a\]").rules
    assert to_regex(tree) == r"\[(?:" + placeholder("r0") + "," + placeholder("r0") + r"{2})?\]"
    assert nonempty(parse("(?:)")) is None


@pytest.mark.parametrize("regex,size", [("a{2,5}b", 6), ("(?:ab|c)*", 3), ("(?:a{3}){2}", 6), ("x?y+", 2),
                                        ("[0-9]{0,4}", 4)])
def test_size_writes_out_bounded_repetitions(regex, size):
    assert parse(regex).size == size


def test_a_repeated_group_is_one_tree():
    tree = parse(r"(?:a[bc)]*d)x(?:a[bc)]*d)")
    assert tree.items[0] is tree.items[2]
    assert parse(r"e(?:a[bc)]*d)").items[1] is tree.items[0]
    nested = parse(r"(?:[[a-c]&&[^b(]]|z)")  # a Rust nested class holding a parenthesis
    assert nested == Alt((Atom("[[a-c]&&[^b(]]"), Atom("z")))


def test_byte_sizes_over_rules():
    r, a, b = placeholder("r"), placeholder("a"), placeholder("b")
    rules = {"r": parse(rf"\[(?:{r}(?:,{r})*)?\]"), "a": parse(f"x{b}"), "b": parse("yy(?:zzz)?")}
    sizes = ByteSizes(rules)
    assert sizes.rules == {"r": 2, "a": 3, "b": 2}
    assert sizes.max_optional_bytes(rules["r"]) == 3  # ",[]" (the repeated item); "[]" as the option
    assert sizes.max_optional_bytes(rules["b"]) == 3  # "zzz" (a rule counts in its own tree)
    assert sizes.min_bytes(parse(f"{a}{a}")) == 6
