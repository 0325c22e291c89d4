"""json_keys: the DFA built directly for "a key that is none of names" has key_regex's language,
and the grammar path uses it through its placeholder."""
import random

import pytest

from gdserve.grammar.cfg_lexer import terminal_dfa
from gdserve.grammar.json_keys import expand_keys, key_dfa, key_placeholder, key_regex, placeholder_names
from gdserve.grammar.json_schema_cfg import schema_to_grammar
from gdserve.grammar.lark_spec import Terminal
from gdserve.grammar.regex_tree import Atom, parse
from gdserve.grammar.token_index import ByteDFA, build_byte_dfa, indexed_pattern, start_state


def _difference(a: ByteDFA, sa: int, b: ByteDFA, sb: int) -> bytes | None:
    """The shortest text one DFA accepts from its state and the other does not (None: same language)."""
    fa, fb = a.trans[:, a.classes], b.trans[:, b.classes]
    seen = {(sa, sb): b""}
    frontier = [(sa, sb)]
    while frontier:
        nxt = []
        for x, y in frontier:
            if a.final[x] != b.final[y]:
                return seen[(x, y)]
            for byte in range(256):
                pair = (int(fa[x, byte]), int(fb[y, byte]))
                if pair not in seen:
                    seen[pair] = seen[(x, y)] + bytes([byte])
                    nxt.append(pair)
        frontier = nxt
    return None


def _reference(names: tuple[str, ...]) -> tuple[ByteDFA, int]:
    dfa = build_byte_dfa(indexed_pattern(key_regex(names)))
    return dfa, start_state(dfa)


NAMES = [("ab", "ac"), ("",), ("", "a", "ab"), ("name", "names", "id", "type"), ("/",), ("a/b", "/"),
         ('q"x', "back\\slash", "tab\tx", "ctl\x01", "del\x7f"), ("café", "naïve", "日本", "emoji😀", "x"),
         ("é",), ("a" * 30, "b" * 25), ("😀",)]


@pytest.mark.parametrize("names", NAMES, ids=range(len(NAMES)))
def test_key_dfa_has_the_regex_language(names):
    dfa = key_dfa(names)
    assert dfa is not None
    assert _difference(dfa, dfa.start, *_reference(names)) is None


def test_key_dfa_on_random_name_sets():
    rng = random.Random(7)
    alphabet = 'abxy_/"\\\t\x01é日😀'
    for _ in range(60):
        names = tuple(sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
                              for _ in range(rng.randint(1, 6))}))
        dfa = key_dfa(names)
        assert _difference(dfa, dfa.start, *_reference(names)) is None, names


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
    dfa = terminal_dfa(terminal)
    assert _difference(dfa, dfa.start, *_reference(many)) is None


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
        dfa = terminal_dfa(t)
        ref = build_byte_dfa(indexed_pattern(f"\\x01(?:{expand_keys(t.regex)})"))
        assert _difference(dfa, dfa.start, ref, ref.walk(start_state(ref), b"\x01")) is None
    assert "\ue002" not in grammar.lark  # the lark form has the keys written out
