"""json.keys: the DFA built directly for "a key that is none of names" has key_regex's language,
and the grammar path uses it through its placeholder."""
import random

import pytest

from gdserve.grammar.cfg.lexer import terminal_dfa
from gdserve.grammar.json.keys import expand_keys, key_dfa, key_placeholder, key_regex, placeholder_names
from gdserve.grammar.json.schema_cfg import schema_to_grammar
from gdserve.grammar.cfg.lark_spec import Terminal
from gdserve.grammar.regex.tree import Atom, parse
from tests.grammar.dfa_check import direct, equivalent


NAMES = [("ab", "ac"), ("",), ("", "a", "ab"), ("name", "names", "id", "type"), ("/",), ("a/b", "/"),
         ('q"x', "back\\slash", "tab\tx", "ctl\x01", "del\x7f"), ("café", "naïve", "日本", "emoji😀", "x"),
         ("é",), ("a" * 30, "b" * 25), ("😀",)]


@pytest.mark.parametrize("names", NAMES, ids=range(len(NAMES)))
def test_key_dfa_has_the_regex_language(names):
    dfa = key_dfa(names)
    assert dfa is not None
    assert equivalent(dfa, direct(key_regex(names)))


def test_key_dfa_on_random_name_sets():
    rng = random.Random(7)
    alphabet = 'abxy_/"\\\t\x01é日😀'
    for _ in range(60):
        names = tuple(sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
                              for _ in range(rng.randint(1, 6))}))
        assert equivalent(key_dfa(names), direct(key_regex(names))), names


def test_key_dfa_refuses_declared_names_in_any_spelling_and_takes_others():
    names = ("ab", "é", "a/")
    dfa = key_dfa(names)

    def accepts(text: bytes) -> bool:
        return bool(dfa.final[dfa.walk(dfa.start, text)])

    for declared in [b'"ab"', '"é"'.encode(), b'"\\u00e9"', b'"\\u00E9"', b'"a/"', b'"a\\/"']:
        assert not accepts(declared), declared
    for other in [b'""', b'"a"', b'"abc"', b'"b"', '"éé"'.encode(), b'"a\\n"', b'"x\\u0041"', b'"a/b"']:
        assert accepts(other), other


def test_names_the_recognizer_cannot_tag_fall_back_to_the_regex():
    many = tuple(chr(0x4E00 + i) for i in range(13))  # more escaped characters than spelled one by one
    assert key_dfa(many) is None
    terminal = Terminal("T", key_placeholder(many), 0, False, False)
    assert equivalent(terminal_dfa(terminal), direct(key_regex(many)))


def test_placeholder_sizes_bound_the_regex_tree_and_round_trip():
    for names in NAMES + [("x" * 20, "xy"), ("ééé",)]:
        atom = parse(key_placeholder(names))
        tree = parse(key_regex(names))
        assert isinstance(atom, Atom) and placeholder_names(atom.text) == names
        assert atom.sizes[0] == tree.sizes[0] and atom.sizes[1] >= tree.sizes[1]
        assert expand_keys("a" + key_placeholder(names) + "b") == "a" + key_regex(names) + "b"
    assert key_placeholder(()) == key_regex(())


def test_grammar_path_key_terminal_is_the_regex_terminal():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "née": {"type": "integer"}},
              "additionalProperties": {"type": "integer"}}
    grammar = schema_to_grammar(schema, open_objects=True)
    keyed = [t for t in grammar.spec().terminals if "\ue002" in t.regex]
    assert keyed
    for t in keyed:
        assert equivalent(terminal_dfa(t), direct(expand_keys(t.regex)))
    assert "\ue002" not in grammar.lark  # the lark form has the keys written out
